// `npm test` at the root runs every workspace's tests as one jest run (projects share the workers).
// Each workspace is given as its project options (jest.preset.js), not as its folder: a folder would load
// the workspace's own jest.config.js, whose global options (testTimeout) jest refuses in a project.
import { existsSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { globalJestOptions, workspaceJestConfig } from './jest.preset.js';

const root = fileURLToPath(new URL('.', import.meta.url));

/** Every workspace folder under `parent` that has tests of its own (a jest.config.js). */
const workspacesIn = (parent) =>
  readdirSync(`${root}${parent}`, { withFileTypes: true })
    .filter((entry) => entry.isDirectory() && existsSync(`${root}${parent}/${entry.name}/jest.config.js`))
    .map((entry) => ({ dir: `${root}${parent}/${entry.name}`, name: entry.name }));

export default {
  projects: [
    ...workspacesIn('packages'),
    ...workspacesIn('services'),
    { dir: `${root}deploy`, name: 'deploy' },
    { dir: `${root}scripts`, name: 'scripts' },
  ].map(({ dir, name }) => workspaceJestConfig(dir, name)),
  globalSetup: './packages/testkit/jest/global-setup.js',
  globalTeardown: './packages/testkit/jest/global-teardown.js',
  ...globalJestOptions,
};
