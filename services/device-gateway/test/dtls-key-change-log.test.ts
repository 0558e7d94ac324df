// A DTLS session ended because its key stopped being valid is logged with whose it was: the device id and the
// PSK identity (and the peer), never the key. The line used to be only "dtls sessions ended: key no longer
// valid" with a count (app.ts), which names no device.
import { Writable } from 'node:stream';
import { createLogger } from '@platform/service-kit';
import { IDENTITY, KEY, KEY_HEX, startEchoServer, waitFor } from './support/dtls.js';
import type { TestServer } from './support/dtls.js';
import { PskClient } from './support/psk-client.js';

let t: TestServer | undefined;

afterEach(async () => {
  PskClient.closeAll();
  await t?.server.close();
  t = undefined;
});

function capturedLogger(): { logger: ReturnType<typeof createLogger>; text: () => string } {
  let written = '';
  const stream = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      written += chunk.toString('utf8');
      callback();
    },
  });
  return { logger: createLogger({ service: 'dtls-test', level: 'info', stream }), text: () => written };
}

const ended = (text: string): Record<string, unknown>[] =>
  text
    .split('\n')
    .filter((line) => line.includes('key no longer valid'))
    .map((line) => JSON.parse(line) as Record<string, unknown>);

describe('a session ended by a key change', () => {
  it.each([
    ['invalidated at a registry reload', (s: TestServer) => s.server.invalidateCredentials(['cred-1'])],
    [
      'found invalid by the periodic check',
      (s: TestServer) => {
        s.credentials.delete(IDENTITY);
        return s.server.revalidate();
      },
    ],
  ])('%s: its line names the device and the identity, not the key', async (_how, invalidate) => {
    const logs = capturedLogger();
    t = await startEchoServer({ logger: logs.logger });
    const device = await PskClient.open({ port: t.port, bindAddress: '127.0.0.1' });
    await device.connect(IDENTITY, KEY);
    expect(invalidate(t)).toBe(1);
    await waitFor(() => ended(logs.text()).length === 1, 2000, 'the log line');
    expect(ended(logs.text())[0]).toMatchObject({
      level: 'info',
      message: 'dtls session ended: key no longer valid',
      device_id: 'device-1',
      identity: IDENTITY,
      peer: expect.stringMatching(/^dtls\|\d+\|127\.0\.0\.1$/) as unknown,
    });
    expect(logs.text()).not.toContain(KEY.toString('utf8'));
    expect(logs.text()).not.toContain(KEY_HEX);
  });
});
