// DTLS fifth pass (docs/benchmarks.md): a harness outside `npm run`, on a worktree's built dist.
// Micro-benchmark of the DTLS record path against plain UDP: N sessions (injected, no handshakes), a fan-out of
// one notification to each (window 2048, chunks of 256, setImmediate between, as the observe pump), each ACKed by
// a client process. Server CPU per notification (ACK included), GC per notification.
// node scripts/dtls-path/udp-harness.mjs <worktree root> <dtls|plain> [N] [rounds]; env CLIENT_COST_US: busy-wait
// per notification in the client (paces the ACKs), TIME_SEND=1: time socket.send, seal and open.
import { fork } from 'node:child_process';
import dgram from 'node:dgram';
import { createCipheriv, createDecipheriv, createHash } from 'node:crypto';
import { PerformanceObserver } from 'node:perf_hooks';
import { readdirSync, readFileSync } from 'node:fs';
globalThis.__t = { seal: 0, open: 0 };
function threadTicks() {
  const out = new Map();
  for (const t of readdirSync('/proc/self/task')) {
    try {
      const st = readFileSync(`/proc/self/task/${t}/stat`, 'utf8');
      const name = st.slice(st.indexOf('(') + 1, st.lastIndexOf(')'));
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      out.set(t, { name, ticks: Number(f[11]) + Number(f[12]) });
    } catch {
      // the thread ended between readdir and read
    }
  }
  return out;
}

const role = process.env.MICRO_ROLE ?? 'server';
const [root, mode = 'dtls', nArg = '10000', roundsArg = '12'] = process.argv.slice(2);
const N = Number(nArg);
const ROUNDS = Number(roundsArg);
const CLIENT_COST_US = Number(process.env.CLIENT_COST_US ?? 0);

function keyBlockOf(i) {
  const a = createHash('sha256').update(`kb-a-${i}`).digest();
  const b = createHash('sha256').update(`kb-b-${i}`).digest();
  return Buffer.concat([a, b]).subarray(0, 40); // client key 0..16, server key 16..32, civ 32..36, siv 36..40
}

function nonce(iv, rec, at) {
  const n = Buffer.alloc(12);
  iv.copy(n, 0);
  rec.copy(n, 4, at, at + 8);
  return n;
}

if (role === 'client') {
  const sockets = [];
  const state = [];
  for (let i = 0; i < N; i++) {
    const s = dgram.createSocket({ type: 'udp4', recvBufferSize: 1 << 20 });
    await new Promise((r) => s.bind(0, '127.0.0.1', r));
    sockets.push(s);
    const kb = keyBlockOf(i);
    state.push({
      ckey: kb.subarray(0, 16),
      skey: kb.subarray(16, 32),
      civ: kb.subarray(32, 36),
      siv: kb.subarray(36, 40),
      seq: 0,
    });
  }
  let serverPort = 0;
  process.on('message', (m) => {
    if (m.cmd === 'port') serverPort = m.port;
  });
  const busy = (us) => {
    if (us <= 0) return;
    const end = performance.now() + us / 1000;
    while (performance.now() < end);
  };
  sockets.forEach((s, i) => {
    const st = state[i];
    s.on('message', (msg) => {
      busy(CLIENT_COST_US);
      let mid;
      if (mode === 'plain') mid = msg.readUInt16BE(2);
      else {
        // epoch 1 application_data: header 13, explicit nonce 8, ciphertext, tag 8
        const d = createDecipheriv('aes-128-ccm', st.skey, nonce(st.siv, msg, 13), { authTagLength: 8 });
        const len = msg.length - 13 - 16;
        d.setAuthTag(msg.subarray(msg.length - 8));
        const aad = Buffer.alloc(13);
        msg.copy(aad, 0, 3, 11);
        aad[8] = msg[0];
        aad.writeUInt16BE(0xfefd, 9);
        aad.writeUInt16BE(len, 11);
        d.setAAD(aad, { plaintextLength: len });
        const pt = d.update(msg.subarray(21, 21 + len));
        d.final();
        mid = pt.readUInt16BE(2);
      }
      const ack = Buffer.from([0x60, 0x00, mid >> 8, mid & 0xff]);
      if (mode === 'plain') s.send(ack, serverPort, '127.0.0.1');
      else {
        const seq = st.seq++;
        const rec = Buffer.alloc(13 + 8 + 4 + 8);
        rec[0] = 23;
        rec.writeUInt16BE(0xfefd, 1);
        rec.writeUInt16BE(1, 3);
        rec.writeUIntBE(seq, 5, 6);
        rec.writeUInt16BE(20, 11);
        rec.writeUInt16BE(1, 13);
        rec.writeUIntBE(seq, 15, 6);
        const c = createCipheriv('aes-128-ccm', st.ckey, nonce(st.civ, rec, 13), { authTagLength: 8 });
        const aad = Buffer.alloc(13);
        rec.copy(aad, 0, 3, 11);
        aad[8] = 23;
        aad.writeUInt16BE(0xfefd, 9);
        aad.writeUInt16BE(4, 11);
        c.setAAD(aad, { plaintextLength: 4 });
        c.update(ack).copy(rec, 21);
        c.final();
        c.getAuthTag().copy(rec, 25);
        s.send(rec, serverPort, '127.0.0.1');
      }
    });
  });
  process.send({ cmd: 'ports', ports: sockets.map((s) => s.address().port) });
} else {
  const child = fork(new URL(import.meta.url).pathname, process.argv.slice(2), {
    env: { ...process.env, MICRO_ROLE: 'client' },
  });
  const ports = await new Promise((r) => child.once('message', (m) => r(m.ports)));
  const silent = { info() {}, warn() {}, error() {}, debug() {} };
  let send; // (i, bytes)
  let onAck; // set below
  let port;
  const notification = Buffer.alloc(120, 0x41);
  notification[0] = 0x48; // ver 1, CON, TKL 8
  notification[1] = 0x45; // 2.05
  if (mode === 'dtls') {
    const { DtlsServer } = await import(`${root}/services/device-gateway/dist/dtls/connector.js`);
    const { Session } = await import(`${root}/services/device-gateway/dist/dtls/session.js`);
    const { ConnectionState } = await import(`${root}/services/device-gateway/dist/dtls/record-layer.js`);
    if (process.env.TIME_SEND) {
      for (const m of ['seal', 'open']) {
        const orig = ConnectionState.prototype[m];
        ConnectionState.prototype[m] = function (...a) {
          const t = performance.now();
          const r = orig.apply(this, a);
          globalThis.__t[m] += performance.now() - t;
          return r;
        };
      }
    }
    const server = new DtlsServer({
      lookupPsk: () => undefined,
      logger: silent,
      maxSessions: 1e6,
      maxSessionsPerAddress: 1e6,
      socketBufferBytes: 4 << 20,
    });
    await server.listen(0, '127.0.0.1');
    port = server.address().port;
    const pubs = [];
    const byPub = new Map();
    for (let i = 0; i < N; i++) {
      const p = ports[i];
      const pub = Object.freeze({
        key: `dtls|${p}|127.0.0.1`,
        address: '127.0.0.1',
        port: p,
        identity: `id-${i}`,
        deviceId: `dev-${i}`,
        credentialId: `c-${i}`,
      });
      const st = new ConnectionState(keyBlockOf(i));
      const s = new Session(pub, st, Buffer.alloc(12), Buffer.alloc(32, i & 0xff), server.now(), 1, 1, 1);
      server.store.sessions.set(pub.key, s);
      pubs.push(pub);
      byPub.set(pub, i);
    }
    // keep the credential check from ending the injected sessions
    server.options.lookupPsk = (identity) => {
      const i = Number(identity.slice(3));
      return { identity, credentialId: `c-${i}`, deviceId: `dev-${i}`, key: Buffer.alloc(16) };
    };
    server.onApplicationData = (session, data) => onAck(data);
    send = (i, bytes) => server.send(pubs[i], bytes);
    globalThis.__server = server;
    globalThis.__sock = server.socket;
  } else {
    const { createUdpSocket } = await import(`${root}/services/device-gateway/dist/net/udp-socket.js`);
    const sock = createUdpSocket('127.0.0.1', 4 << 20);
    await new Promise((r) => sock.bind(0, '127.0.0.1', r));
    port = sock.address().port;
    sock.on('message', (msg, rinfo) => {
      const key = `udp|${rinfo.port}|${rinfo.address}`; // as udp-transport builds its peer
      onAck(msg, key);
    });
    send = (i, bytes) => sock.send(bytes, ports[i], '127.0.0.1');
    globalThis.__sock = sock;
  }
  child.send({ cmd: 'port', port });
  let sendNs = 0;
  if (process.env.TIME_SEND) {
    const s0 = globalThis.__sock;
    const orig = s0.send;
    s0.send = function (...a) {
      const t = performance.now();
      const r = orig.apply(this, a);
      sendNs += performance.now() - t;
      return r;
    };
  }

  let gcMs = 0;
  let gcCount = 0;
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      gcMs += e.duration;
      gcCount++;
    }
  }).observe({ entryTypes: ['gc'] });

  const WINDOW = 2048;
  const CHUNK = 256;
  async function round() {
    let next = 0;
    let inflight = 0;
    let acked = 0;
    let blocked = false;
    let scheduled = false;
    let mid = 0;
    let done;
    const finished = new Promise((r) => (done = r));
    const pump = () => {
      scheduled = false;
      let sent = 0;
      while (next < N && sent < CHUNK) {
        if (inflight >= WINDOW) {
          blocked = true;
          return;
        }
        const bytes = Buffer.from(notification); // a fresh encoding per notification, as the observe layer makes
        mid = (mid + 1) & 0xffff;
        bytes.writeUInt16BE(mid, 2);
        send(next++, bytes);
        inflight++;
        sent++;
      }
      if (next < N) schedule();
    };
    const schedule = () => {
      if (scheduled) return;
      scheduled = true;
      setImmediate(pump);
    };
    onAck = (data) => {
      if (data.length !== 4 || data[0] !== 0x60) return;
      inflight--;
      acked++;
      if (blocked) {
        blocked = false;
        schedule();
      }
      if (acked === N) done();
    };
    const sn0 = sendNs;
    const ts0 = { ...globalThis.__t };
    const gc0 = gcMs;
    const gcn0 = gcCount;
    const th0 = threadTicks();
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    pump();
    await finished;
    const c = process.cpuUsage(c0);
    const th1 = threadTicks();
    let mainT = 0,
      otherT = 0;
    for (const [t, v] of th1) {
      const d = v.ticks - (th0.get(t)?.ticks ?? 0);
      if (t === String(process.pid)) mainT += d;
      else otherT += d;
    }
    const wall = performance.now() - t0;
    await new Promise((r) => setTimeout(r, 50));
    return {
      us: (c.user + c.system) / N,
      sys: c.system / N,
      gcUs: ((gcMs - gc0) * 1000) / N,
      gcs: gcCount - gcn0,
      wallMs: wall,
      mainUs: (mainT * 10000) / N,
      sendUs: ((sendNs - sn0) * 1000) / N,
      sealUs: ((globalThis.__t.seal - ts0.seal) * 1000) / N,
      openUs: ((globalThis.__t.open - ts0.open) * 1000) / N,
      otherUs: (otherT * 10000) / N,
    };
  }
  const results = [];
  for (let r = 0; r < ROUNDS; r++) {
    const res = await round();
    if (r >= 2) results.push(res); // two warm-up rounds
  }
  const med = (k) => {
    const v = results.map((x) => x[k]).sort((a, b) => a - b);
    return v[Math.floor(v.length / 2)];
  };
  console.log(
    `${mode} ${root.split('/').pop()} N=${N} cost=${CLIENT_COST_US}: cpu/notif median ${med('us').toFixed(2)} µs (sys ${med('sys').toFixed(2)}), gc ${med('gcUs').toFixed(2)} µs, wall ${med('wallMs').toFixed(0)} ms; main thread ${med('mainUs').toFixed(1)} other threads ${med('otherUs').toFixed(1)} µs; socket.send ${med('sendUs').toFixed(2)} µs; seal ${med('sealUs').toFixed(2)} open ${med('openUs').toFixed(2)}; all: ${results.map((x) => x.us.toFixed(1)).join(' ')}`,
  );
  child.kill();
  process.exit(0);
}
