// The first `npm start`: it says what it is doing while TypeScript compiles (a minute of silence before), and
// LOG_FORMAT=pretty prints the services' JSON lines as text (lib/log-format.ts). stack.test.ts runs a stack
// with it and checks the stack's progress lines.
import { execSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { logFormatFrom, prettyLogLine } from '../src/lib/log-format.js';

const manifest = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
  scripts: Record<string, string>;
};

describe('npm start', () => {
  it('says it is compiling before tsc -b runs', () => {
    const start = manifest.scripts.start!;
    const at = start.indexOf(' && tsc -b && ');
    expect(at).toBeGreaterThan(0);
    // What runs before the compiler, run as npm runs it (sh -c); its message goes to stderr.
    const said = execSync(`(${start.slice(0, at)}) 2>&1 >/dev/null`, { encoding: 'utf8', shell: '/bin/sh' });
    expect(said).toMatch(/compiling TypeScript \(tsc -b: about a minute the first time/);
  });
});

describe('LOG_FORMAT', () => {
  it("is in the README's environment table", () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    expect(readme).toMatch(/^\| `LOG_FORMAT` \| `npm start` \| `json`.*`pretty`/m);
  });

  it('is json unless set, pretty when asked, and refused otherwise', () => {
    expect(logFormatFrom(undefined)).toBe('json');
    expect(logFormatFrom('')).toBe('json');
    expect(logFormatFrom('pretty')).toBe('pretty');
    expect(() => logFormatFrom('text')).toThrow('LOG_FORMAT must be json or pretty, not "text"');
  });

  it('pretty prints a service line as time, level, service, message and its fields', () => {
    const line = JSON.stringify({
      code: 'not_ready',
      duration_ms: 52.353,
      level: 'info',
      message: 'http request',
      method: 'GET',
      path: '/ready',
      request_id: 'e59e3271',
      service: 'enterprise-workflow',
      status: 503,
      timestamp: '2026-11-28T16:39:52.921Z',
    });
    expect(prettyLogLine(line)).toBe(
      '16:39:52.921 info  enterprise-workflow  http request  code=not_ready duration_ms=52.353 method=GET ' +
        'path=/ready request_id=e59e3271 status=503',
    );
    // Values with spaces, quotes or structure are JSON; a line that is not a JSON object passes as it is.
    expect(
      prettyLogLine(
        JSON.stringify({
          level: 'warn',
          message: 'flush failed',
          service: 'device-gateway',
          error: 'connection "refused"',
          rows: [1, 2],
          timestamp: '2026-11-28T16:39:53.000Z',
        }),
      ),
    ).toBe('16:39:53.000 warn  device-gateway  flush failed  error="connection \\"refused\\"" rows=[1,2]');
    expect(prettyLogLine('Invalid configuration (1 problem):')).toBe('Invalid configuration (1 problem):');
    expect(prettyLogLine('[1,2]')).toBe('[1,2]');
  });
});
