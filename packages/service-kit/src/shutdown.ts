import type { Server } from 'node:http';
import type { Logger } from 'winston';

export interface ShutdownStep {
  /** Shown in the log, e.g. `http`, `coap`, `db pool`. */
  name: string;
  close: () => Promise<void>;
}

export interface ShutdownOptions {
  logger: Logger;
  /** Bound on the whole sequence in milliseconds; past it the process exits with 1. */
  timeoutMs: number;
  /** Run in order: stop intake first (HTTP, CoAP), then what in-flight work still needs (pools). */
  steps: ShutdownStep[];
  /** Defaults to SIGTERM and SIGINT. */
  signals?: NodeJS.Signals[];
  /** Defaults to `process.exit`; injectable for tests. */
  exit?: (code: number) => void;
}

export interface ShutdownHandle {
  /** Starts the sequence (as a signal would); resolves when it has ended and `exit` was called. */
  shutdown: (reason: string) => Promise<void>;
  /** Removes the signal listeners. */
  dispose: () => void;
}

/**
 * On the first SIGTERM/SIGINT, runs `steps` in order (a failing step is logged and the next one still
 * runs) and exits 0, or 1 if a step failed or `timeoutMs` passed. A second signal exits 1 at once.
 */
export function installShutdown(options: ShutdownOptions): ShutdownHandle {
  const { logger, timeoutMs, steps } = options;
  const exit = options.exit ?? ((code: number) => process.exit(code));
  const signals = options.signals ?? ['SIGTERM', 'SIGINT'];
  let running: Promise<void> | undefined;
  let exited = false;

  const finish = (code: number): void => {
    if (exited) return;
    exited = true;
    exit(code);
  };

  const shutdown = (reason: string): Promise<void> => {
    if (running !== undefined) return running;
    running = new Promise<void>((resolve) => {
      const started = Date.now();
      logger.info('shutting down', { reason, timeout_ms: timeoutMs });
      const timer = setTimeout(() => {
        logger.error('shutdown timed out; forcing exit', { timeout_ms: timeoutMs });
        finish(1);
        resolve();
      }, timeoutMs);

      void (async () => {
        let failed = false;
        for (const step of steps) {
          if (exited) return;
          const stepStarted = Date.now();
          try {
            await step.close();
            logger.info('shutdown step done', { step: step.name, duration_ms: Date.now() - stepStarted });
          } catch (err) {
            failed = true;
            logger.error('shutdown step failed', { step: step.name, err });
          }
        }
        clearTimeout(timer);
        logger.info('shutdown complete', { duration_ms: Date.now() - started, clean: !failed });
        finish(failed ? 1 : 0);
        resolve();
      })();
    });
    return running;
  };

  const onSignal = (signal: NodeJS.Signals): void => {
    if (running !== undefined) {
      logger.warn('second signal during shutdown; forcing exit', { signal });
      finish(1);
      return;
    }
    void shutdown(signal);
  };

  for (const signal of signals) process.on(signal, onSignal);
  return {
    shutdown,
    dispose: () => {
      for (const signal of signals) process.off(signal, onSignal);
    },
  };
}

/** How often idle keep-alive sockets are swept while draining, in milliseconds. */
const IDLE_SWEEP_MS = 100;

/**
 * Stops accepting connections and lets in-flight requests finish: idle keep-alive sockets are closed
 * at once and again as each busy one goes idle; after `graceMs` the remaining sockets are cut.
 * Resolves when the server has closed.
 */
export function closeHttpServer(server: Server, graceMs: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (!server.listening) {
      resolve();
      return;
    }
    const sweep = setInterval(() => server.closeIdleConnections(), IDLE_SWEEP_MS);
    const force = setTimeout(() => server.closeAllConnections(), graceMs);
    server.close((err) => {
      clearInterval(sweep);
      clearTimeout(force);
      if (err !== undefined) reject(err);
      else resolve();
    });
    server.closeIdleConnections();
  });
}
