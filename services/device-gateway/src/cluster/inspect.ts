// The device view across replicas (design §3.8): a replica asked for one device publishes a request on
// INSPECT_CHANNEL; every other replica writes its live part (relations, DTLS sessions) into
// device_gateway.inspect_answers, which only the gateway's login can read, and says so on the channel; the asker
// waits for the replicas whose bus session is up, or a deadline, reads their answers and says which answered.
//
// Why this shape: NOTIFY and LISTEN need no privilege, so any session of the database that learns the channel's
// name can send on it and hear everything on it; since migration 0035 the name carries a secret only the owner
// and the gateway's login can read (channels.ts), and the rules below still hold for whoever learns it. Hence:
// - nothing secret is ever in a payload: requests and answer notices name a query and a replica; the device asked
//   about (migration 0017's inspect_queries) and the answers (PSK identities, peer addresses) stay in tables only
//   the login reads;
// - a notification counts only when it was sent by a session of the gateway's own login (its backend pid, which
//   PostgreSQL reports with every notification, is one of that login's sessions in pg_stat_activity); any other
//   sender is dropped before its payload is parsed, so it can neither use up the answer budget nor make a
//   replica do work; while a sender is unknown, at most two of its notifications wait for the look, and one
//   found not to be the login's is dropped unread for a second, so strangers cannot crowd out the gateway's own
//   new connections;
// - answers are read only for the replicas asked (one row each), once each, and field by field, each item
//   against the published schema; an answer is written on at most two connections at once;
// - the whole exchange keeps to one deadline, each step to what is left of it.
import { randomUUID } from 'node:crypto';
import { isDeviceId } from '@platform/contracts';
import { errorMessage, type Logger } from '@platform/service-kit';
import { READ_GRACE_MS, withDeadline } from '../deadline.js';

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

// One-letter fields like the bus's (messages.ts says why): the store (delivery/sql.ts) builds both notices' JSON
// in SQL, after the commit of the request's or answer's row (migration 0021), as the functions used to.

/**
 * "Send me your live part of the device of query `q`", on INSPECT_CHANNEL. The device is named only in
 * device_gateway.inspect_queries (migration 0017), which only the gateway's login reads: a listener learns no
 * device id. device_gateway.inspect_ask writes both.
 */
interface Request {
  /** Kind: `q`, a query. */
  k: 'q';
  /** Query id (a UUID): names the query's row and the answers in device_gateway.inspect_answers. */
  q: string;
  /** Origin: the asking replica's id. */
  o: string;
}

/** "My answer to query `q` is in the table". */
interface AnswerNotice {
  /** Kind: `a`, an answer notice. */
  k: 'a';
  /** Query id the answer is for. */
  q: string;
  /** Origin: the answering replica's id. */
  o: string;
}

/** The exchange in PostgreSQL (delivery/sql.ts inspectStore). */
export interface InspectStore {
  /** Stores the query (device_gateway.inspect_ask), then sends its request on INSPECT_CHANNEL after the commit. */
  publishRequest(query: string, deviceId: string, origin: string): Promise<void>;
  /** The device a query of `origin` asks about (undefined: no such query, or it is gone). */
  queryDevice(query: string, origin: string): Promise<string | undefined>;
  /** Stores a replica's answer (device_gateway.inspect_answer), then notifies the asker after the commit. */
  writeAnswer(query: string, replica: string, answer: string): Promise<void>;
  /** The answers stored for a query, by replica. */
  readAnswers(query: string, replicas: readonly string[]): Promise<{ replica: string; answer: unknown }[]>;
  /** The replicas whose bus session is up now. */
  liveReplicas(): Promise<string[]>;
  /** Backend pids of the gateway login's sessions (pg_stat_activity). */
  loginPids(): Promise<number[]>;
}

/** Relations and sessions listed per replica; the totals are always exact. */
export const LIST_LIMIT = 16;

/** This replica's own part of a device view: with the bus (Inspector.gather) or alone. */
export function ownPart(origin: string, local: LocalView, deviceId: string): ReplicaPart {
  return { replica: origin, self: true, answered: true, ...local(deviceId, LIST_LIMIT) };
}

/** This replica's live part of a device, with at most `limit` relations and sessions listed. */
export type LocalView = (deviceId: string, limit: number) => LiveView;

export interface InspectorOptions {
  origin: string;
  local: LocalView;
  store: InspectStore;
  deadlineMs: number;
  logger: Logger;
  /** Answers sent per second at most. */
  answersPerSecond?: number;
}

const ID = /^[0-9a-f]{16}$/;
const QUERY_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** Requests and answer notices are short; anything longer is not ours. */
const MAX_PAYLOAD = 300;
/** The login's sessions are looked up again at most this often when an unknown sender appears (ms). */
const PID_REFRESH_MS = 250;
/** A look at the login's sessions that takes longer than this counts as failed (ms). */
const PID_LOOK_MS = 1000;
/**
 * Notifications from unknown senders held until that look (at most about 300 KB); of one sender, at most
 * UNKNOWN_PER_SENDER. A stranger that reconnects for every two notifications gets round the per-sender cap
 * (a cold review: 200-280 connections a second refilled a queue of 64 after each look, and a view from a new
 * pooled connection of the gateway was dropped); filling 1,024 between two looks takes about 2,000 new
 * connections a second.
 */
const UNKNOWN_QUEUE = 1024;
const UNKNOWN_PER_SENDER = 2;
/** A sender found not to be the login's is dropped unread for this long (ms), then looked at again. */
const FOREIGN_MS = 1000;
/** Answers being written at once, at most (each holds a pooled connection). */
const ANSWERS_IN_FLIGHT = 2;
/** A look at the login's sessions is trusted this long (ms); then the next notification makes a new one. */
const PID_MAX_AGE_MS = 5000;

export class Inspector {
  private readonly waiting = new Map<
    string,
    { expected: ReadonlySet<string>; answered: Set<string>; wake(): void }
  >();
  private tokens: number;
  private refilledAt = Date.now();
  private pids = new Set<number>();
  private pidsAt = 0;
  private refreshTimer: NodeJS.Timeout | undefined;
  private readonly unknown: { payload: string; senderPid: number }[] = [];
  /** Queued notifications per unknown sender. */
  private readonly unknownBySender = new Map<number, number>();
  /** Senders found not to be the login's, and until when their notifications are dropped unread. */
  private readonly foreign = new Map<number, number>();
  private answering = 0;
  readonly stats = { requests: 0, answered: 0, dropped: 0, foreign: 0 };

  constructor(private readonly options: InspectorOptions) {
    this.tokens = options.answersPerSecond ?? 50;
  }

  /** This replica's part and every other live replica's (or `answered: false` past the deadline). */
  async gather(deviceId: string): Promise<ReplicaPart[]> {
    const self = ownPart(this.options.origin, this.options.local, deviceId);
    const deadline = Date.now() + this.options.deadlineMs;
    const left = (): number => Math.max(1, deadline - Date.now());
    let expected: string[];
    try {
      expected = (await withDeadline(this.options.store.liveReplicas(), left())).filter(
        (r) => r !== this.options.origin && ID.test(r),
      );
    } catch (err) {
      this.options.logger.warn('device view: replica list unavailable', { error: errorMessage(err) });
      return [self];
    }
    if (expected.length === 0) return [self];
    const q = randomUUID();
    const answered = new Set<string>();
    let wake = (): void => undefined;
    const allIn = new Promise<void>((resolve) => (wake = resolve));
    this.waiting.set(q, {
      expected: new Set(expected),
      answered,
      wake: () => {
        if (answered.size === expected.length) wake();
      },
    });
    const answers = new Map<string, LiveView>();
    try {
      await withDeadline(this.options.store.publishRequest(q, deviceId, this.options.origin), left());
      if (deadline > Date.now()) {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([allIn, new Promise<void>((r) => (timer = setTimeout(r, left())))]);
        clearTimeout(timer);
      }
      // Also answers whose notice was missed: the table is the truth, for the replicas asked.
      const rows = await withDeadline(
        this.options.store.readAnswers(q, expected),
        Math.max(READ_GRACE_MS, deadline - Date.now()),
      );
      for (const row of rows) {
        if (!expected.includes(row.replica) || answers.has(row.replica)) continue;
        const view = liveView(row.answer);
        if (view !== undefined) answers.set(row.replica, view);
      }
    } catch (err) {
      this.options.logger.warn('device view: other replicas not asked or not read', {
        error: errorMessage(err),
      });
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

  /** A notification on INSPECT_CHANNEL and the backend pid of the session that sent it. */
  receive(payload: string, senderPid: number): void {
    if (payload.length > MAX_PAYLOAD) {
      this.stats.foreign++;
      return;
    }
    // A known pid counts while the last look is fresh; after that its notification waits for a new look like an
    // unknown sender's (a cold review: a pid one of the login's sessions left stayed trusted until a stranger's
    // notification happened to make the inspector look again, and a stranger's session can reuse it).
    if (this.pids.has(senderPid) && Date.now() - this.pidsAt <= PID_MAX_AGE_MS) {
      this.handle(payload);
      return;
    }
    // An unknown sender: a session of the login opened since the last look (a pool grows), or not ours at all.
    // It waits for the next look at the login's sessions, at most four a second. A sender found foreign is
    // dropped unread for a second (then looked at again: PostgreSQL reuses pids), and each sender has at most
    // two notifications waiting, so one stranger's flood cannot fill the queue ahead of the gateway's own new
    // connections (a cold review's finding: a flood made two views in five miss a replica that had answered).
    const until = this.foreign.get(senderPid);
    if (until !== undefined && until > Date.now()) {
      this.stats.foreign++;
      return;
    }
    const queued = this.unknownBySender.get(senderPid) ?? 0;
    if (this.unknown.length >= UNKNOWN_QUEUE || queued >= UNKNOWN_PER_SENDER) {
      this.stats.foreign++;
      return;
    }
    this.unknownBySender.set(senderPid, queued + 1);
    this.unknown.push({ payload, senderPid });
    this.scheduleRefresh();
  }

  private scheduleRefresh(): void {
    if (this.refreshTimer !== undefined) return;
    const wait = Math.max(0, this.pidsAt + PID_REFRESH_MS - Date.now());
    this.refreshTimer = setTimeout(() => {
      let looked = false;
      void withDeadline(this.options.store.loginPids(), PID_LOOK_MS)
        .then(
          (pids) => {
            this.pids = new Set(pids);
            looked = true;
          },
          (err: unknown) => {
            this.options.logger.warn('device view: login sessions unavailable', { error: errorMessage(err) });
          },
        )
        .finally(() => {
          this.pidsAt = Date.now();
          this.refreshTimer = undefined;
          // A look that failed says nothing of the senders: they stay queued for the next one (a cold review
          // had the gateway's own new connections marked foreign for a second after a failed look).
          if (!looked) {
            if (this.unknown.length > 0) this.scheduleRefresh();
            return;
          }
          const queued = this.unknown.splice(0);
          this.unknownBySender.clear();
          for (const [pid, until] of this.foreign) if (until <= this.pidsAt) this.foreign.delete(pid);
          for (const { payload, senderPid } of queued) {
            if (this.pids.has(senderPid)) this.handle(payload);
            else {
              this.stats.foreign++;
              this.foreign.set(senderPid, this.pidsAt + FOREIGN_MS);
            }
          }
        });
    }, wait);
    this.refreshTimer.unref();
  }

  private handle(payload: string): void {
    const message = decode(payload);
    if (message === undefined || message.o === this.options.origin) {
      if (message === undefined) this.stats.dropped++;
      return;
    }
    if (message.k === 'a') {
      const waiting = this.waiting.get(message.q);
      if (waiting === undefined || !waiting.expected.has(message.o)) return;
      waiting.answered.add(message.o);
      waiting.wake();
      return;
    }
    this.stats.requests++;
    // At most ANSWERS_IN_FLIGHT answers hold a pooled connection at once: a write that waits (0016 bounds the
    // wait at 200 ms) never takes the pool the record and the API need (a cold review had four waiting 4 s).
    if (this.answering >= ANSWERS_IN_FLIGHT || !this.take()) {
      this.stats.dropped++;
      return;
    }
    this.answering++;
    const { store, origin, local } = this.options;
    store
      .queryDevice(message.q, message.o)
      .then(async (deviceId) => {
        if (deviceId === undefined || !isDeviceId(deviceId)) {
          this.stats.dropped++;
          return;
        }
        await store.writeAnswer(message.q, origin, JSON.stringify(local(deviceId, LIST_LIMIT)));
        this.stats.answered++;
      })
      .catch((err: unknown) =>
        this.options.logger.warn('device view: answer not written', { error: errorMessage(err) }),
      )
      .finally(() => this.answering--);
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

function decode(payload: string): Request | AnswerNotice | undefined {
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
  if (m.k === 'q') return { k: 'q', q: m.q, o: m.o };
  return m.k === 'a' ? { k: 'a', q: m.q, o: m.o } : undefined;
}

const MAX_TOTAL = 10_000_000;
const isTotal = (v: unknown): v is number =>
  Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= MAX_TOTAL;

/** Another replica's stored answer, read field by field (it is data from the database, checked like input). */
function liveView(data: unknown): LiveView | undefined {
  if (typeof data !== 'object' || data === null) return undefined;
  const v = data as Record<string, unknown>;
  if (
    !Array.isArray(v.relations) ||
    !Array.isArray(v.dtls_sessions) ||
    !isTotal(v.relations_total) ||
    !isTotal(v.dtls_sessions_total)
  )
    return undefined;
  return {
    relations: items(v.relations, RELATION_FIELDS),
    relations_total: v.relations_total,
    dtls_sessions: items(v.dtls_sessions, SESSION_FIELDS),
    dtls_sessions_total: v.dtls_sessions_total,
  };
}

type Field = (v: unknown) => boolean;
const oneOf =
  (...values: string[]): Field =>
  (v) =>
    typeof v === 'string' && values.includes(v);
/** An ISO 8601 time as `toISOString` writes it. */
const time: Field = (v) => typeof v === 'string' && /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/.test(v);
/** An IPv4 or IPv6 address as node's dgram reports it. */
const address: Field = (v) => typeof v === 'string' && v.length <= 45 && /^[0-9A-Za-z:.%_-]+$/.test(v);
const port: Field = (v) => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= 65535;

/**
 * What a relation and a DTLS session are in the published DeviceView (packages/contracts, gateway-responses.ts),
 * every field required: an item from another replica is shown only when it is exactly that, so neither a newer
 * release nor the login (design §3.8) can put other keys, types or values into the answer (a cold review's
 * finding: `port: "abc"`, `note`, `resource: "evil"` were shown).
 */
const RELATION_FIELDS: Readonly<Record<string, Field>> = {
  resource: oneOf('settings', 'record'),
  transport: oneOf('plain', 'dtls'),
  type: oneOf('CON', 'NON'),
  address,
  port,
  since: time,
  last_version: (v) => v === null || (Number.isSafeInteger(v) && (v as number) >= 0),
  con_in_flight: (v) => typeof v === 'boolean',
  last_confirmed_at: time,
};
const SESSION_FIELDS: Readonly<Record<string, Field>> = {
  identity: (v) => typeof v === 'string' && v.length <= 256,
  address,
  port,
  established_at: time,
  last_record_at: time,
};

/** The first LIST_LIMIT items that are exactly `fields` (copied field by field); any other item is left out. */
function items(list: unknown[], fields: Readonly<Record<string, Field>>): Record<string, unknown>[] {
  const names = Object.keys(fields);
  const out: Record<string, unknown>[] = [];
  for (const item of list.slice(0, LIST_LIMIT)) {
    if (typeof item !== 'object' || item === null || Array.isArray(item)) continue;
    const v = item as Record<string, unknown>;
    if (Object.keys(v).length !== names.length) continue;
    if (!names.every((k) => Object.hasOwn(v, k) && fields[k]!(v[k]))) continue;
    const copy: Record<string, unknown> = {};
    for (const k of names) copy[k] = v[k];
    out.push(copy);
  }
  return out;
}
