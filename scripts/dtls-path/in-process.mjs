// DTLS fifth pass (docs/benchmarks.md): a harness outside `npm run`, on a worktree's built dist.
// In-process: seal of a 120-byte notification and open of a 4-byte ACK on each of N connection states, and the
// connector's receive path (onDatagram without a socket) for the ACK. CPU per pair incl. GC.
// node scripts/dtls-path/in-process.mjs <worktree root> [N] [rounds]
import { createCipheriv, createHash } from 'node:crypto';
import { PerformanceObserver } from 'node:perf_hooks';
const [root, nArg = '10000', rArg = '12'] = process.argv.slice(2);
const N = Number(nArg);
const { ConnectionState } = await import(`${root}/services/device-gateway/dist/dtls/record-layer.js`);
const { DtlsServer } = await import(`${root}/services/device-gateway/dist/dtls/connector.js`);
const { Session } = await import(`${root}/services/device-gateway/dist/dtls/session.js`);
const kb = (i) =>
  Buffer.concat([
    createHash('sha256').update(`a${i}`).digest(),
    createHash('sha256').update(`b${i}`).digest(),
  ]).subarray(0, 40);
const silent = { info() {}, warn() {}, error() {}, debug() {} };
const server = new DtlsServer({ lookupPsk: () => undefined, logger: silent });
server.socket = { send() {} }; // no socket: sendRaw is a no-op call
const pubs = [];
const acks = []; // per session, per round: the client's ACK record (epoch 1, seq r)
const ROUNDS = Number(rArg);
for (let i = 0; i < N; i++) {
  const pub = Object.freeze({
    key: `dtls|${10000 + i}|127.0.0.1`,
    address: '127.0.0.1',
    port: 10000 + i,
    identity: `i${i}`,
    deviceId: `d${i}`,
    credentialId: `c${i}`,
  });
  const k = kb(i);
  const s = new Session(pub, new ConnectionState(k), Buffer.alloc(12), Buffer.alloc(32), 0, 1, 1, 1);
  server.store.sessions.set(pub.key, s);
  pubs.push(pub);
  const list = [];
  for (let r = 0; r < ROUNDS; r++) {
    const rec = Buffer.alloc(33);
    rec[0] = 23;
    rec.writeUInt16BE(0xfefd, 1);
    rec.writeUInt16BE(1, 3);
    rec.writeUIntBE(r, 5, 6);
    rec.writeUInt16BE(20, 11);
    rec.writeUInt16BE(1, 13);
    rec.writeUIntBE(r, 15, 6);
    const nonce = Buffer.concat([k.subarray(32, 36), rec.subarray(13, 21)]);
    const c = createCipheriv('aes-128-ccm', k.subarray(0, 16), nonce, { authTagLength: 8 });
    const aad = Buffer.alloc(13);
    rec.copy(aad, 0, 3, 11);
    aad[8] = 23;
    aad.writeUInt16BE(0xfefd, 9);
    aad.writeUInt16BE(4, 11);
    c.setAAD(aad, { plaintextLength: 4 });
    c.update(Buffer.from([0x60, 0, r, 1])).copy(rec, 21);
    c.final();
    c.getAuthTag().copy(rec, 25);
    list.push(rec);
  }
  acks.push(list);
}
let got = 0;
server.onApplicationData = () => {
  got++;
};
let gcMs = 0;
new PerformanceObserver((l) => {
  for (const e of l.getEntries()) gcMs += e.duration;
}).observe({ entryTypes: ['gc'] });
const notif = Buffer.alloc(120, 0x41);
const res = [];
for (let r = 0; r < ROUNDS; r++) {
  const g0 = gcMs;
  const c0 = process.cpuUsage();
  for (let i = 0; i < N; i++) {
    server.send(pubs[i], Buffer.from(notif));
    server.onDatagram(acks[i][r], '127.0.0.1', 10000 + i);
  }
  const c = process.cpuUsage(c0);
  if (r >= 2) res.push({ us: (c.user + c.system) / N, gc: ((gcMs - g0) * 1000) / N });
  await new Promise((x) => setTimeout(x, 20));
}
if (got !== N * ROUNDS) throw new Error(`opened ${got}`);
const med = (k) => res.map((x) => x[k]).sort((a, b) => a - b)[res.length >> 1];
console.log(
  `${root.split('/').pop()}: seal+send+receive+open per notification ${med('us').toFixed(2)} µs (gc ${med('gc').toFixed(2)}); all ${res.map((x) => x.us.toFixed(1)).join(' ')}`,
);
