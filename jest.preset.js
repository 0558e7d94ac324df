// Shared jest settings for every workspace. Sources are ESM TypeScript; ts-jest transpiles each file
// on its own (type checking is `tsc -b`'s job), and workspace packages resolve to their sources so a
// test never needs a previous build of the package it imports.
//
// jest 29 reads `testTimeout` (a global option) only from the configuration it was started with: the root
// one under `npm test`, a workspace's own under that workspace's `npm test`. A project that sets it is
// warned about (`Unknown option "testTimeout"`, once per project per run), so project options and the
// global ones are kept apart: the root configuration builds its projects with workspaceJestConfig, and
// each workspace's jest.config.js (its standalone run) adds the globals with standaloneJestConfig.
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('.', import.meta.url));

/** Global options, read only from the configuration jest was started with. 30 s per test, ms. */
export const globalJestOptions = { testTimeout: 30000 };

/**
 * A workspace as a jest project (project options only).
 * @param {string} dir absolute directory of the workspace
 * @param {string} displayName
 */
export function workspaceJestConfig(dir, displayName) {
  return {
    displayName,
    rootDir: dir,
    testEnvironment: 'node',
    testMatch: ['<rootDir>/test/**/*.test.ts'],
    extensionsToTreatAsEsm: ['.ts'],
    transform: {
      '^.+\\.ts$': ['ts-jest', { useESM: true, tsconfig: `${root}tsconfig.test.json` }],
    },
    moduleNameMapper: {
      '^@platform/(contracts|service-kit|enterprise-db|testkit)$': `${root}packages/$1/src/index.ts`,
      '^@platform/(device-gateway|enterprise-workflow)$': `${root}services/$1/src/index.ts`,
      '^@platform/deploy$': `${root}deploy/src/index.ts`,
      // NodeNext sources import siblings as './x.js'; jest must find './x.ts'.
      '^(\\.{1,2}/.*)\\.js$': '$1',
    },
    globalSetup: `${root}packages/testkit/jest/global-setup.js`,
    globalTeardown: `${root}packages/testkit/jest/global-teardown.js`,
  };
}

/**
 * A workspace's own jest configuration (its `npm test`): the project plus the global options.
 * @param {string} dir absolute directory of the workspace
 * @param {string} displayName
 */
export function standaloneJestConfig(dir, displayName) {
  return { ...workspaceJestConfig(dir, displayName), ...globalJestOptions };
}
