// Review 45 (cold): Inspector's trust of senders by backend pid, without a database (a fake InspectStore).
import { describe, expect, it } from '@jest/globals';
import { createLogger } from '@platform/service-kit';
import { Inspector, type InspectStore } from '../src/cluster/inspect.js';

const logger = createLogger({ service: 'review45', level: 'error' });
const ORIGIN = '0123456789abcdef';
const OTHER = 'fedcba9876543210';
const q = (n: number): string => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;
const request = (n: number): string => JSON.stringify({ k: 'q', q: q(n), o: OTHER });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function store(pids: () => Promise<number[]>): InspectStore & { written: string[] } {
  const written: string[] = [];
  return {
    written,
    publishRequest: () => Promise.resolve(),
    queryDevice: () => Promise.resolve('acme-hq-hvac-01'),
    writeAnswer: (query) => {
      written.push(query);
      return Promise.resolve();
    },
    readAnswers: () => Promise.resolve([]),
    liveReplicas: () => Promise.resolve([]),
    loginPids: pids,
  };
}

const local = () => ({ relations: [], relations_total: 0, dtls_sessions: [], dtls_sessions_total: 0 });

describe('review 45: Inspector sender trust', () => {
  it("a pid once the login's is not trusted more than 5 s after that session ended", async () => {
    let login = [100];
    const s = store(() => Promise.resolve(login));
    const i = new Inspector({ origin: ORIGIN, local, store: s, deadlineMs: 100, logger });
    i.receive(request(1), 100); // unknown: looked up, found the login's
    await sleep(300);
    expect(s.written).toEqual([q(1)]);
    login = []; // session 100 ends; PostgreSQL gives pid 100 to a stranger's new session
    await sleep(5500); // a look is trusted 5 s (PID_MAX_AGE_MS); before, until an unknown sender appeared
    i.receive(request(2), 100); // the stranger, on the reused pid
    await sleep(50);
    console.log('answers written for the reused pid:', s.written);
    expect(s.written).toEqual([q(1)]);
  });

  it("a failed look at the login's sessions marks nobody foreign: the login's own new pid is answered at the next look", async () => {
    let fail = true;
    const s = store(() =>
      fail ? Promise.reject(new Error('timeout exceeded when trying to connect')) : Promise.resolve([200]),
    );
    const i = new Inspector({ origin: ORIGIN, local, store: s, deadlineMs: 100, logger });
    i.receive(request(1), 200); // the login's new pool connection; the look fails (pool busy)
    await sleep(300);
    fail = false;
    i.receive(request(2), 200); // the look works now, but pid 200 is "foreign" for a second: dropped unread
    await sleep(400);
    console.log('answers written:', s.written, 'stats', JSON.stringify(i.stats));
    expect(s.written).toContain(q(2));
  });
});
