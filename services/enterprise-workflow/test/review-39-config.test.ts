// Issue 39 §4, the workflow's probe: configuration the sweep depends on. MULTIPART_SWEEP_GRACE_S=0 was
// accepted, and a replica with a short grace abandons intents other replicas are still starting (design §4.4):
// the grace is bounded below, by a floor and by the deadlines an intent's start may take.
import { ConfigError } from '@platform/service-kit';
import { loadWorkflowConfig, MIN_SWEEP_GRACE_S, sweepGraceFloorS } from '../src/config.js';

const minimal = {
  DATABASE_URL: 'postgres://enterprise_api_login:secret-pw@db:5432/platform',
  OIDC_ISSUER_URL: 'https://id.example.com/realms/platform',
  S3_BUCKET: 'media',
  WEBHOOK_TOKENS: 'tok-a-0123456789abcdef',
};

function problemsOf(env: Record<string, string>): string {
  try {
    loadWorkflowConfig({ ...minimal, ...env });
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as Error).message;
  }
  return '';
}

describe('MULTIPART_SWEEP_GRACE_S', () => {
  it('is refused below the floor, with a message naming the variable', () => {
    for (const grace of ['0', '1', String(MIN_SWEEP_GRACE_S - 1)])
      expect(problemsOf({ MULTIPART_SWEEP_GRACE_S: grace })).toMatch(
        /MULTIPART_SWEEP_GRACE_S: must be >= 60/,
      );
    expect(loadWorkflowConfig({ ...minimal, MULTIPART_SWEEP_GRACE_S: '60' }).multipart.sweepGraceS).toBe(60);
    expect(loadWorkflowConfig(minimal).multipart.sweepGraceS).toBe(600);
  });

  it('is refused when shorter than an intent start the configured deadlines allow', () => {
    // 120 s for the store's answer and 2 × (10 + 20) s for the two database steps: 180 s.
    const slow = {
      S3_REQUEST_TIMEOUT_MS: '120000',
      DB_CONNECT_TIMEOUT_MS: '10000',
      DB_QUERY_TIMEOUT_MS: '20000',
    };
    expect(
      sweepGraceFloorS({
        S3_REQUEST_TIMEOUT_MS: 120000,
        DB_CONNECT_TIMEOUT_MS: 10000,
        DB_QUERY_TIMEOUT_MS: 20000,
      }),
    ).toBe(180);
    expect(problemsOf({ ...slow, MULTIPART_SWEEP_GRACE_S: '179' })).toMatch(
      /MULTIPART_SWEEP_GRACE_S: must be at least 180 s, longer than an intent's start can take/,
    );
    expect(
      loadWorkflowConfig({ ...minimal, ...slow, MULTIPART_SWEEP_GRACE_S: '180' }).multipart.sweepGraceS,
    ).toBe(180);
    // The defaults' start (3 s + 2 × (2 + 4) s = 15 s) is under the floor, which then decides.
    expect(
      sweepGraceFloorS({
        S3_REQUEST_TIMEOUT_MS: 3000,
        DB_CONNECT_TIMEOUT_MS: 2000,
        DB_QUERY_TIMEOUT_MS: 4000,
      }),
    ).toBe(MIN_SWEEP_GRACE_S);
  });
});
