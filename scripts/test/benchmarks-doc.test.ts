// docs/benchmarks.md and the README against package.json: the number of benchmarks the document states,
// every `bench:*` script in both command tables, and no section presenting as the latest figures that
// was measured on another Node.js release than the one the project runs on (the root devDependency `node`).
import { readFileSync } from 'node:fs';

const read = (path: string): string => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
const manifest = JSON.parse(read('package.json')) as {
  scripts: Record<string, string>;
  devDependencies: Record<string, string>;
};
const benchmarks = read('docs/benchmarks.md');
const readme = read('README.md');
const scripts = Object.keys(manifest.scripts).filter((name) => name.startsWith('bench:'));
const numbers = ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine', 'ten'];

describe('docs/benchmarks.md', () => {
  it('states how many benchmarks there are', () => {
    expect(scripts.length).toBeGreaterThan(0);
    expect(benchmarks).toContain(`The ${numbers[scripts.length]!} benchmarks print figures`);
  });

  it('lists every bench script in its table and in the README', () => {
    const readmeRow = readme.split('\n').find((line) => line.startsWith('| `npm run bench:')) ?? '';
    for (const script of scripts) {
      expect({ script, inBenchmarks: benchmarks.includes(`| \`npm run ${script}\``) }).toEqual({
        script,
        inBenchmarks: true,
      });
      expect({ script, inReadme: readmeRow.includes(`${script}\``) }).toEqual({ script, inReadme: true });
    }
  });

  it('calls figures the latest only when they were measured on the Node.js release the project runs on', () => {
    const latest = benchmarks
      .split('\n')
      .filter((line) => /^#+ .*\blatest\b/i.test(line) && !line.startsWith('# '));
    for (const heading of latest) expect(heading).toContain(`Node ${manifest.devDependencies.node}`);
  });
});
