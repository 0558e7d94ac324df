// One lint configuration for the whole repository: type-aware typescript-eslint rules plus jest hygiene.
import { readFileSync } from 'node:fs';
import js from '@eslint/js';
import globals from 'globals';
import jest from 'eslint-plugin-jest';
import tseslint from 'typescript-eslint';

const manifest = (dir) => JSON.parse(readFileSync(new URL(`${dir}/package.json`, import.meta.url), 'utf8'));
const root = manifest('.');

/**
 * Runtime code must not import what production images do not install (the ops image once crashed on
 * an import of @platform/testkit). Images install `npm ci --omit=dev -w <workspace>`: the workspace's
 * `dependencies` and theirs, never a `devDependency` of the root or of any workspace, nor the dev-only
 * testkit. So in each shipped workspace's `src/`, every devDependency of the repository that the
 * workspace does not itself depend on is refused, type-only imports included (a build stage does not
 * install them either). Exempt, because no image runs them: tests and benchmarks (`test/`, `bench/`,
 * outside `src/`), the testkit itself, `scripts/` (npm start, token and the benchmarks: development
 * tooling built on the testkit by design; no Dockerfile copies it), and deploy's offline validators
 * (`deploy/src/validate/`, `validate-cli.ts`: CI tooling whose parsers are deploy's devDependencies).
 * deploy/test/images.test.ts runs each image's CMD from what its Dockerfile copies, which also catches
 * what a rule cannot see (dynamic imports, createRequire).
 */
/**
 * A workspace imports another by its package name (`@platform/...`), never by a relative path into its
 * folder: a relative import bypasses the other package's `exports`, its build order and the image's
 * dependency list. Applied to every file, tests included; merged into the rules below, because a later
 * `no-restricted-imports` replaces an earlier one rather than adding to it.
 */
const crossWorkspace = {
  regex: '^(\\.\\./)+(packages|services|deploy|scripts)/',
  message:
    'Import another workspace by its package name (@platform/...), not by a relative path into its folder.',
};

function devOnlyImportRules() {
  const workspaces = root.workspaces.filter((dir) => dir !== 'packages/testkit');
  const devOnly = new Set([
    '@platform/testkit',
    ...Object.keys(root.devDependencies ?? {}),
    ...root.workspaces.flatMap((dir) => Object.keys(manifest(dir).devDependencies ?? {})),
  ]);
  return workspaces.flatMap((dir) => {
    const own = new Set(Object.keys(manifest(dir).dependencies ?? {}));
    const refused = [...devOnly].filter((name) => !own.has(name) && !name.startsWith('@types/')).sort();
    const message = `It is a devDependency: production images install \`npm ci --omit=dev\` without it. Runtime code of ${dir} may import only its \`dependencies\`; tests, benchmarks and scripts/ may use dev packages.`;
    const rule = (extraPatterns) => ({
      'no-restricted-imports': [
        'error',
        {
          paths: refused.map((name) => ({ name, message })),
          patterns: [
            { group: refused.map((name) => `${name}/*`), message },
            crossWorkspace,
            ...extraPatterns,
          ],
        },
      ],
    });
    const configs = [
      {
        files: [`${dir}/src/**/*.ts`],
        ignores: ['deploy/src/validate/**', 'deploy/src/validate-cli.ts'],
        rules: rule([]),
      },
    ];
    if (dir === 'services/enterprise-workflow')
      configs.push({ files: [`${dir}/src/domain/**/*.ts`], rules: rule([domainLayer]) });
    return configs;
  });
}

/**
 * The workflow's use cases know no transport and no SDK: they reach the store and learn the caller through
 * the ports of src/domain/ports.ts, and the HTTP edge alone chooses statuses and headers.
 */
const domainLayer = {
  group: ['express', '@aws-sdk/*', 'jose', '../http/*', '../storage/*', '../auth/*'],
  message:
    'src/domain stays free of transports and SDKs: use a port from ./ports.js, implemented by an adapter.',
};

export default tseslint.config(
  {
    ignores: ['**/dist/**', '**/node_modules/**', '.data/**', 'coverage/**'],
  },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/switch-exhaustiveness-check': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': 'error',
      'no-restricted-imports': ['error', { patterns: [crossWorkspace] }],
    },
  },
  ...devOnlyImportRules(),
  {
    // Configuration files and small scripts in JavaScript: linted too, without type information.
    files: ['**/*.js', '**/*.mjs', '**/*.cjs'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      globals: { ...globals.node },
      sourceType: 'module',
      parserOptions: { projectService: false, project: false, program: null },
    },
  },
  {
    // Configuration is read once, at start, by the config modules and passed in (design §5.1): shipped code
    // elsewhere never reads process.env. Entry points hand the environment to their config loader.
    files: ['packages/*/src/**/*.ts', 'services/*/src/**/*.ts', 'deploy/src/**/*.ts'],
    ignores: [
      '**/src/config.ts',
      'packages/testkit/src/**',
      'deploy/src/*-main.ts',
      'deploy/src/jwks-sync.ts',
      'deploy/src/validate/**',
    ],
    rules: {
      'no-restricted-properties': [
        'error',
        {
          object: 'process',
          property: 'env',
          message:
            'Only config modules and entry points read process.env; take the value from the config passed in.',
        },
      ],
    },
  },
  {
    files: ['**/test/**/*.ts', '**/bench/**/*.ts'],
    ...jest.configs['flat/recommended'],
    rules: {
      ...jest.configs['flat/recommended'].rules,
      'jest/no-focused-tests': 'error',
      'jest/no-disabled-tests': 'error',
      'jest/expect-expect': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/unbound-method': 'off',
    },
  },
);
