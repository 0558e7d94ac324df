// Shared jest settings for every workspace. Sources are ESM TypeScript; ts-jest transpiles each file
// on its own (type checking is `tsc -b`'s job), and workspace packages resolve to their sources so a
// test never needs a previous build of the package it imports.
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('.', import.meta.url));

/** @param {string} dir absolute directory of the workspace */
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
    testTimeout: 30000,
  };
}
