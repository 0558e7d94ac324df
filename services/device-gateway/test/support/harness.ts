import { validateDesiredSettings } from '@platform/contracts';
import { CoapServer, defaultCoapOptions, type CoapServerOptions } from '../../src/coap/server.js';
import { maxDocumentBytes } from '../../src/coap/representations.js';
import type { DeviceRecord } from '../../src/domain/documents.js';
import { GatewayState } from '../../src/domain/gateway-state.js';
import { VersionClock } from '../../src/domain/version-clock.js';

export const silentLogger = {
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
  debug: () => undefined,
};

export function device(deviceId: string, extra: Partial<DeviceRecord> = {}): DeviceRecord {
  return {
    deviceId,
    siteId: '00000000-0000-4000-8000-000000000001',
    name: `Device ${deviceId}`,
    model: 'test-model',
    enabled: true,
    desiredSettings: { reporting_interval_s: 60 },
    ...extra,
  };
}

export function newState(): GatewayState {
  return new GatewayState({
    clock: new VersionClock(),
    maxDocumentBytes: maxDocumentBytes(defaultCoapOptions.maxTokenLength),
    validateSettings: validateDesiredSettings,
  });
}

export async function startCoap(
  records: DeviceRecord[],
  options: Partial<CoapServerOptions> = {},
): Promise<{ state: GatewayState; server: CoapServer; port: number }> {
  const state = newState();
  state.replaceRegistry(records);
  const server = new CoapServer(state, { ...defaultCoapOptions, logger: silentLogger, ...options });
  await server.listen(0, '127.0.0.1');
  return { state, server, port: server.address().port };
}
