// `node scripts/dist/bench-notify-path.js` (after `npx tsc -b`): the CPU a notify-settings costs below HTTP and
// above CoAP, in one process: the request's validation, then the override into the state (one process: no bus),
// with one observer's listener reduced to a no-op. The same calls exist in every build since the move to
// prepared overrides (GatewayState.setOverride), so builds can be compared by swapping the gateway's dist.
import { validateDesiredSettings, validateNotifySettingsRequest } from '@platform/contracts';
import { GatewayState, VersionClock } from '@platform/device-gateway';

const N = Number(process.env.BENCH_NOTIFIES ?? 200_000);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);

const state = new GatewayState({
  clock: new VersionClock(),
  // One CoAP datagram with the default 64-byte token limit (coap/wire.ts maxDocumentBytes).
  maxDocumentBytes: 1024,
  validateSettings: validateDesiredSettings,
});
const deviceId = 'bench-000000';
state.replaceRegistry([
  {
    deviceId,
    siteId: 'a1000000-0000-4000-8000-000000000001',
    name: 'Bench device 0',
    model: 'bench',
    enabled: true,
    desiredSettings: { reporting_interval_s: 60 },
  },
]);
let changes = 0;
state.onChange(() => changes++);

const cpuUs = (u: NodeJS.CpuUsage): number => u.user + u.system;
for (let round = 0; round <= ROUNDS; round++) {
  // Bodies as express.json hands them to the route: parsed per request.
  const bodies = Array.from(
    { length: N },
    (_, i) =>
      JSON.parse(`{"device_id":"${deviceId}","settings":{"reporting_interval_s":${10 + (i % 80_000)}}}`) as {
        device_id: string;
        settings: Record<string, unknown>;
      },
  );
  const t0 = process.cpuUsage();
  for (const body of bodies) {
    if (!validateNotifySettingsRequest(body).ok) throw new Error('invalid');
    state.setOverride(body.device_id, body.settings);
  }
  const us = cpuUs(process.cpuUsage(t0)) / N;
  // Round 0 warms the JIT up and is not printed.
  if (round > 0) console.log(`round ${round}: ${us.toFixed(2)} µs CPU per notify (validation + override)`);
}
if (changes === 0) throw new Error('no change was emitted');
