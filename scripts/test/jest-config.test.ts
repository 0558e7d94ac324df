// The jest configuration as jest reads it: `npm test` (the root configuration, every workspace a project)
// and a workspace's own `npm test` must both load without a validation warning and keep the 30 s test
// timeout. jest 29 reads `testTimeout` only from the top-level configuration; a project that sets it
// printed `Unknown option "testTimeout"` once per project on every run.
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const repoRoot = fileURLToPath(new URL('../../', import.meta.url));
const jestBin = `${repoRoot}node_modules/jest/bin/jest.js`;

/** jest's own output for `args`, run from `cwd` as that folder's `npm test` runs it. */
async function jestOutput(cwd: string, args: string[]): Promise<{ stdout: string; stderr: string }> {
  return promisify(execFile)(process.execPath, ['--experimental-vm-modules', jestBin, ...args], {
    cwd,
    maxBuffer: 16 * 1024 * 1024,
  });
}

describe('jest configuration', () => {
  it('the root run loads every project without a validation warning and times tests out at 30 s', async () => {
    const listed = await jestOutput(repoRoot, ['--listTests']);
    expect(listed.stderr).not.toMatch(/Unknown option|Validation Warning/);
    // Every workspace is still a project: a test file of each one is listed.
    for (const workspace of ['packages/contracts', 'services/device-gateway', 'deploy', 'scripts'])
      expect(listed.stdout).toContain(`${repoRoot}${workspace}/test/`);
    const shown = JSON.parse((await jestOutput(repoRoot, ['--showConfig'])).stdout) as {
      globalConfig: { testTimeout: number };
      configs: Array<Record<string, unknown>>;
    };
    expect(shown.globalConfig.testTimeout).toBe(30000);
    expect(shown.configs.length).toBeGreaterThanOrEqual(8);
  });

  it("a workspace's own run loads without a validation warning and keeps the same timeout", async () => {
    const cwd = `${repoRoot}packages/contracts`;
    const { stdout, stderr } = await jestOutput(cwd, ['--showConfig']);
    expect(stderr).not.toMatch(/Unknown option|Validation Warning/);
    const shown = JSON.parse(stdout) as { globalConfig: { testTimeout: number } };
    expect(shown.globalConfig.testTimeout).toBe(30000);
  });
});
