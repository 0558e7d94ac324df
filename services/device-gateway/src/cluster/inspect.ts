// The device view across replicas (design §3.8): a replica asked for one device publishes a request on
// INSPECT_CHANNEL; every other replica answers there with its live part (relations, DTLS sessions); the asker
// waits for the replicas whose bus session is up, or a deadline, and says which answered. NOTIFY has no
// privileges (any session of the database may send on any channel), so requests and answers are untrusted
// input: parsed defensively, answered at a bounded rate, and an answer carries nothing secret.
import { randomUUID } from 'node:crypto';
import { isDeviceId } from '@platform/contracts';
import { errorMessage, type Logger } from '@platform/service-kit';
import { NOTIFY_PAYLOAD_LIMIT_BYTES } from './messages.js';

/** One replica's live part of a device (what it alone knows). */
export interface LiveView {
  relations: unknown[];
  relations_total: number;
  dtls_sessions: unknown[];
  dtls_sessions_total: number;
}

export interface ReplicaPart extends Partial<LiveView> {
  replica: string;
  self: boolean;
  answered: boolean;
}

interface Request {
  k: 'q';
  q: string;
  d: string;
  o: string;
}

interface Answer {
  k: 'a';
  q: string;
  o: string;
  v: LiveView;
}

export interface InspectorOptions {
  origin: string;
  /** This replica's live part of a device, with at most `limit` relations and sessions listed. */
  local: (deviceId: string, limit: number) => LiveView;
  /** Sends a payload on INSPECT_CHANNEL (pg_notify through the pool). */
  publish: (payload: string) => Promise<void>;
  /** The replicas whose bus session is up now (delivery/sql.ts liveReplicas). */
  liveReplicas: () => Promise<string[]>;
  deadlineMs: number;
  logger: Logger;
  /** Answers sent per second at most (a flood of requests on the channel cannot make this replica busy). */
  answersPerSecond?: number;
}

const ID = /^[0-9a-f]{16}$/;
const QUERY_ID = /^[0-9a-f-]{36}$/;
/** Relations and sessions listed per replica; the totals are always exact. */
const LIST_LIMIT = 16;

export class Inspector {
  private readonly waiting = new Map<
    string,
    { deviceId: string; expected: ReadonlySet<string>; answers: Map<string, LiveView>; wake(): void }
  >();
  private tokens: number;
  private refilledAt = Date.now();
  readonly stats = { requests: 0, answered: 0, dropped: 0 };

  constructor(private readonly options: InspectorOptions) {
    this.tokens = options.answersPerSecond ?? 50;
  }

  /** This replica's part and every other live replica's (or `answered: false` past the deadline). */
  async gather(deviceId: string): Promise<ReplicaPart[]> {
    const self: ReplicaPart = {
      replica: this.options.origin,
      self: true,
      answered: true,
      ...this.options.local(deviceId, LIST_LIMIT),
    };
    const deadline = Date.now() + this.options.deadlineMs;
    let expected: string[];
    try {
      expected = (await withDeadline(this.options.liveReplicas(), this.options.deadlineMs)).filter(
        (r) => r !== this.options.origin,
      );
    } catch (err) {
      this.options.logger.warn('device view: replica list unavailable', { error: errorMessage(err) });
      return [self];
    }
    if (expected.length === 0) return [self];
    const q = randomUUID();
    const answers = new Map<string, LiveView>();
    let wake = (): void => undefined;
    const allIn = new Promise<void>((resolve) => (wake = resolve));
    this.waiting.set(q, {
      deviceId,
      expected: new Set(expected),
      answers,
      wake: () => {
        if (expected.every((r) => answers.has(r))) wake();
      },
    });
    try {
      const request: Request = { k: 'q', q, d: deviceId, o: this.options.origin };
      await withDeadline(this.options.publish(JSON.stringify(request)), this.options.deadlineMs);
      const left = deadline - Date.now();
      if (left > 0) {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([allIn, new Promise<void>((r) => (timer = setTimeout(r, left)))]);
        clearTimeout(timer);
      }
    } catch (err) {
      this.options.logger.warn('device view: request not published', { error: errorMessage(err) });
    } finally {
      this.waiting.delete(q);
    }
    const parts: ReplicaPart[] = [self];
    for (const replica of expected) {
      const view = answers.get(replica);
      parts.push(
        view === undefined
          ? { replica, self: false, answered: false }
          : { replica, self: false, answered: true, ...view },
      );
    }
    return parts;
  }

  /** A payload from INSPECT_CHANNEL: a request to answer, or an answer to a request of ours. */
  receive(payload: string): void {
    const message = decode(payload);
    if (message === undefined) {
      this.stats.dropped++;
      return;
    }
    if (message.o === this.options.origin) return;
    if (message.k === 'a') {
      const waiting = this.waiting.get(message.q);
      // Only the replicas whose bus session is up may answer, once each: anyone can LISTEN, see the request
      // and answer it, so an answer from a replica not in the list, or a second one, is dropped.
      if (waiting === undefined || !waiting.expected.has(message.o) || waiting.answers.has(message.o)) {
        this.stats.dropped++;
        return;
      }
      waiting.answers.set(message.o, message.v);
      waiting.wake();
      return;
    }
    this.stats.requests++;
    if (!this.take()) {
      this.stats.dropped++;
      return;
    }
    const answer = this.answerPayload(message);
    this.options.publish(answer).then(
      () => this.stats.answered++,
      (err: unknown) =>
        this.options.logger.warn('device view: answer not published', { error: errorMessage(err) }),
    );
  }

  /** The answer, its lists shortened until it fits one NOTIFY payload (the totals stay exact). */
  private answerPayload(request: Request): string {
    for (let limit = LIST_LIMIT; ; limit = Math.floor(limit / 2)) {
      const answer: Answer = {
        k: 'a',
        q: request.q,
        o: this.options.origin,
        v: this.options.local(request.d, limit),
      };
      const payload = JSON.stringify(answer);
      if (limit === 0 || Buffer.byteLength(payload) <= NOTIFY_PAYLOAD_LIMIT_BYTES) return payload;
    }
  }

  private take(): boolean {
    const rate = this.options.answersPerSecond ?? 50;
    const now = Date.now();
    this.tokens = Math.min(rate, this.tokens + ((now - this.refilledAt) / 1000) * rate);
    this.refilledAt = now;
    if (this.tokens < 1) return false;
    this.tokens--;
    return true;
  }
}

function decode(payload: string): Request | Answer | undefined {
  if (payload.length > NOTIFY_PAYLOAD_LIMIT_BYTES) return undefined;
  let data: unknown;
  try {
    data = JSON.parse(payload);
  } catch {
    return undefined;
  }
  if (typeof data !== 'object' || data === null) return undefined;
  const m = data as Record<string, unknown>;
  if (typeof m.q !== 'string' || !QUERY_ID.test(m.q) || typeof m.o !== 'string' || !ID.test(m.o))
    return undefined;
  if (m.k === 'q') return isDeviceId(m.d) ? { k: 'q', q: m.q, d: m.d, o: m.o } : undefined;
  if (m.k !== 'a' || typeof m.v !== 'object' || m.v === null) return undefined;
  const v = m.v as Record<string, unknown>;
  if (
    !Array.isArray(v.relations) ||
    !Array.isArray(v.dtls_sessions) ||
    !Number.isSafeInteger(v.relations_total) ||
    !Number.isSafeInteger(v.dtls_sessions_total)
  )
    return undefined;
  return {
    k: 'a',
    q: m.q,
    o: m.o,
    v: {
      relations: v.relations.slice(0, LIST_LIMIT).map(flat),
      relations_total: v.relations_total as number,
      dtls_sessions: v.dtls_sessions.slice(0, LIST_LIMIT).map(flat),
      dtls_sessions_total: v.dtls_sessions_total as number,
    },
  };
}

/** An item of another replica's answer as shown to the caller: its scalar fields only, strings bounded. */
function flat(item: unknown): Record<string, string | number | boolean | null> {
  const out: Record<string, string | number | boolean | null> = {};
  if (typeof item !== 'object' || item === null) return out;
  for (const [key, value] of Object.entries(item as Record<string, unknown>).slice(0, 16)) {
    if (!/^[a-z_]{1,32}$/.test(key)) continue;
    if (typeof value === 'string') out[key] = value.slice(0, 200);
    else if (typeof value === 'number' || typeof value === 'boolean' || value === null) out[key] = value;
  }
  return out;
}

function withDeadline<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
