// The replica bus's PostgreSQL LISTEN connection (design §3.6): one dedicated pg.Client (a pooled connection
// cannot LISTEN: the pool hands it to other queries and may close it), reconnected forever with backoff, with a
// heartbeat that finds a silently dead connection. What the notifications mean is bus.ts's business.
import {
  errorMessage,
  isConnectionError,
  PINNED_SESSION_OPTIONS,
  resetOwnDefaults,
  type Logger,
} from '@platform/service-kit';
import pg from 'pg';
import { channelName, readChannelSecret } from './channels.js';

export type ListenerStatus = 'stopped' | 'connecting' | 'resyncing' | 'listening';

export interface ListenerOptions {
  databaseUrl: string;
  /**
   * Base names (fixed identifiers, never input): the bus's channel, the device view's and the rollouts' (design
   * §3.6, §3.8, §3.9). The connection LISTENs on each with the installation's secret (channels.ts) and reports a
   * notification under its base name.
   */
  channels: readonly string[];
  logger: Logger;
  /** The session's `application_name` for the next connection. */
  applicationName: () => string;
  /** Reconnect backoff: first delay and cap, in ms (doubling, with ±20 % jitter). */
  reconnectMinMs: number;
  reconnectMaxMs: number;
  /**
   * A `SELECT 1` on the connection this often (ms) finds a silently dead connection; a notification received
   * within the last period, or while the `SELECT 1` waited, proves the connection alive as well.
   */
  heartbeatMs: number;
  /** `senderPid`: the backend pid of the session that sent it (PostgreSQL reports it with every notification). */
  onNotification: (payload: string, channel: string, senderPid: number) => void;
  /**
   * Runs after every LISTEN (status `resyncing`); the connection counts as listening once it resolves. A
   * rejection drops the connection and reconnects.
   */
  onListening: (client: pg.Client) => Promise<void>;
}

export class ListenConnection {
  private statusValue: ListenerStatus = 'stopped';
  /** The last connect attempt failed because PostgreSQL could not be reached. */
  private unreachableValue = false;
  private stopping = false;
  private client: pg.Client | undefined;
  private backendPid: number | undefined;
  private running: Promise<void> | undefined;
  private wake: (() => void) | undefined;
  reconnects = 0;

  constructor(private readonly options: ListenerOptions) {}

  get status(): ListenerStatus {
    return this.statusValue;
  }

  get unreachable(): boolean {
    return this.unreachableValue;
  }

  /** The connection's backend process id (pg_stat_activity.pid), while connected. */
  get pid(): number | undefined {
    return this.backendPid;
  }

  start(): void {
    this.stopping = false;
    this.running ??= this.run();
  }

  async stop(): Promise<void> {
    this.stopping = true;
    this.wake?.();
    const client = this.client;
    if (client !== undefined) await client.end().catch(() => undefined);
    await this.running;
    this.running = undefined;
    this.statusValue = 'stopped';
  }

  private async run(): Promise<void> {
    let delayMs = this.options.reconnectMinMs;
    while (!this.stopping) {
      this.statusValue = 'connecting';
      let connected = false;
      try {
        const { client, closed } = await this.connect();
        connected = true;
        this.unreachableValue = false;
        this.statusValue = 'resyncing';
        await this.options.onListening(client);
        if (this.stopping) break;
        this.statusValue = 'listening';
        delayMs = this.options.reconnectMinMs;
        const reason = await closed;
        if (this.stopping) break;
        this.options.logger.warn('listener connection lost; reconnecting', { error: reason });
      } catch (err) {
        if (this.stopping) break;
        if (!connected) this.unreachableValue = isConnectionError(err);
        this.options.logger.warn('cluster bus connect or resync failed; retrying', {
          error: errorMessage(err),
          retry_in_ms: delayMs,
        });
      }
      await this.dropClient();
      if (this.stopping) break;
      this.statusValue = 'connecting';
      this.reconnects++;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, delayMs * (0.8 + 0.4 * Math.random()));
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = undefined;
      delayMs = Math.min(delayMs * 2, this.options.reconnectMaxMs);
    }
    await this.dropClient();
  }

  /** Connects and LISTENs; `closed` settles when the connection is gone (wrapped: an async function would adopt it). */
  private async connect(): Promise<{ client: pg.Client; closed: Promise<string> }> {
    const client = new pg.Client({
      connectionString: this.options.databaseUrl,
      application_name: this.options.applicationName(),
      // Server-side TCP keepalives (about 1 min): the session of a replica that vanished without closing
      // its connection (a lost node) leaves pg_stat_activity soon, instead of after the kernel's 2 h
      // default, so it neither keeps counting as up in bus_join() nor holds a backend.
      // PINNED_SESSION_OPTIONS: what a role default of this login (ALTER ROLE ... SET) must not change.
      options: [
        PINNED_SESSION_OPTIONS,
        '-c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3',
      ].join(' '),
      connectionTimeoutMillis: 5000,
      keepAlive: true,
      query_timeout: Math.max(1000, this.options.heartbeatMs),
      // The server's own deadline too: a statement the client gave up on (a join waiting for the bus's lock)
      // ends on the server as well, instead of leaving a backend behind at every reconnect.
      statement_timeout: Math.max(1000, this.options.heartbeatMs),
    });
    this.client = client;
    let signal: (reason: string) => void = () => undefined;
    const closed = new Promise<string>((resolve) => (signal = resolve));
    client.on('error', (err) => signal(err.message));
    client.on('end', () => signal('connection ended'));
    // Channel name (with the secret) -> base name, filled before the first LISTEN.
    const bases = new Map<string, string>();
    /** When the last notification arrived (ms): a connection streaming them is alive. */
    let lastMessageAt = 0;
    client.on('notification', (n) => {
      lastMessageAt = Date.now();
      const base = bases.get(n.channel);
      if (base !== undefined) this.options.onNotification(n.payload ?? '', base, n.processId);
    });
    await client.connect();
    this.backendPid = (client as unknown as { processID?: number }).processID;
    // Whatever else the login gave itself as defaults (the pool's connections do the same), before LISTEN.
    await resetOwnDefaults(client, this.options.logger);
    const secret = await readChannelSecret(client);
    for (const base of this.options.channels) bases.set(channelName(base, secret), base);
    // Base names are fixed identifiers and the secret is 32 hex digits (checked): never input.
    for (const channel of bases.keys()) await client.query(`LISTEN ${channel}`);
    let beating = false;
    const heartbeat = setInterval(() => {
      if (beating || Date.now() - lastMessageAt < this.options.heartbeatMs) return;
      beating = true;
      const sentAt = Date.now();
      client.query('SELECT 1').then(
        () => (beating = false),
        (err: unknown) => {
          beating = false;
          // Its answer queued behind notifications that did arrive meanwhile: slow, not dead.
          if (lastMessageAt >= sentAt) return;
          signal(`heartbeat failed: ${errorMessage(err)}`);
          // A connection that does not answer is ended so the loop can replace it.
          void client.end().catch(() => undefined);
        },
      );
    }, this.options.heartbeatMs);
    heartbeat.unref();
    void closed.then(() => clearInterval(heartbeat));
    return { client, closed };
  }

  private async dropClient(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.backendPid = undefined;
    if (client !== undefined) await client.end().catch(() => undefined);
  }
}
