/**
 * Node and V8 flags for the processes a benchmark starts, from `BENCH_NODE_ARGS` (space-separated, e.g.
 * `--max-semi-space-size=32`), for GC and JIT experiments without editing the benchmark.
 */
export function benchNodeArgs(): string[] {
  return (process.env.BENCH_NODE_ARGS ?? '').split(' ').filter((arg) => arg !== '');
}
