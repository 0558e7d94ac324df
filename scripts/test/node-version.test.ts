// Lint, build and every test run on Node 24 (LTS), the release the images are built FROM.
// `npm install` puts Node 24 in node_modules/.bin (the root devDependency `node`, from the npm registry),
// and npm puts node_modules/.bin first on PATH for `npm test`, `npm start` and every `npm run` script,
// whatever Node ran npm itself. This test fails when that chain breaks: jest's worker, a child started
// with process.execPath and a child started as `node` from PATH (the two ways tests and the local stack
// start processes) must all be the Node the root package.json pins.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

const root = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
  engines: { node: string };
  devDependencies: Record<string, string>;
};
const pinned = root.devDependencies.node;

describe('the Node.js the tests run on', () => {
  it('is the pinned release, which satisfies engines', () => {
    expect(root.engines.node).toBe('>=24');
    expect(pinned).toMatch(/^24\.\d+\.\d+$/);
    expect(process.versions.node).toBe(pinned);
  });

  it('is also what children started with process.execPath or as `node` from PATH run', () => {
    const viaExecPath = execFileSync(process.execPath, ['-p', 'process.versions.node'], { encoding: 'utf8' });
    const viaPath = execFileSync('node', ['-p', 'process.versions.node'], { encoding: 'utf8' });
    expect([viaExecPath.trim(), viaPath.trim()]).toEqual([pinned, pinned]);
  });
});
