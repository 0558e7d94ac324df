// `npm test` at the root runs every workspace's tests as one jest run (projects share the workers).
export default {
  projects: ['<rootDir>/packages/*', '<rootDir>/services/*', '<rootDir>/deploy', '<rootDir>/scripts'],
  globalSetup: './packages/testkit/jest/global-setup.js',
  globalTeardown: './packages/testkit/jest/global-teardown.js',
  // jest 29 reads testTimeout only from the top-level configuration, not from a project's.
  testTimeout: 30000,
};
