// The local stack's stand-in for MinIO's webhook target: s3rver reports created objects as S3 event
// records; this posts each one to the workflow's webhook in MinIO's shape — one event per request,
// `{EventName, Key: "<bucket>/<key>", Records: [record]}`, bearer token — and retries failures with
// backoff, as MinIO does when its target has a queue_dir (design §4.4).
import { errorMessage } from '@platform/service-kit';
import type { S3EventRecord } from '@platform/testkit';

const RETRY_DELAYS_MS = [500, 1000, 2000, 4000, 8000, 16000];

export async function forwardToWebhook(
  url: string,
  token: string,
  record: S3EventRecord,
  log: (message: string) => void,
): Promise<void> {
  // MinIO names events with the `s3:` prefix; s3rver follows AWS, which has none.
  const eventName = record.eventName.startsWith('s3:') ? record.eventName : `s3:${record.eventName}`;
  const body = JSON.stringify({
    EventName: eventName,
    Key: `${record.s3.bucket.name}/${record.s3.object.key}`,
    Records: [{ ...record, eventName }],
  });
  for (let attempt = 0; ; attempt++) {
    let outcome: string;
    try {
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
        body,
        signal: AbortSignal.timeout(5000),
      });
      if (res.ok) return;
      outcome = `answered ${res.status}`;
      // 4xx other than 408/429 will not get better by retrying (MinIO retries them anyway; we log).
      if (res.status < 500 && res.status !== 408 && res.status !== 429) {
        log(`webhook ${outcome} for ${record.s3.object.key}; not retried`);
        return;
      }
    } catch (err) {
      outcome = errorMessage(err);
    }
    const delay = RETRY_DELAYS_MS[attempt];
    if (delay === undefined) {
      log(`webhook delivery for ${record.s3.object.key} failed ${attempt + 1} times (${outcome}); dropped`);
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
}
