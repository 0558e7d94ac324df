// Issue 39 §4, the workflow's probe: a valid request followed by garbage on the same connection (HTTP/1.1
// pipelining) committed, but its client received the garbage's 400 instead of its own answer, so it could not
// know the decision was made. Answers go out in the order of the requests (design §6): the decision's 200
// first, then the refusal. Raw sockets against the app as main.ts serves it (service-kit listenHttp).
import type { Server } from 'node:http';
import { demoSites } from '@platform/enterprise-db';
import { listenHttp } from '@platform/service-kit';
import { rawHttpExchange } from '@platform/testkit';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
let server: Server;
let port: number;
let alice: string;
const lab = demoSites.acmeLab.id;

beforeAll(async () => {
  h = await startHarness();
  alice = await h.issuer.demoToken('alice');
  server = await listenHttp(h.app, 0, '127.0.0.1');
  const address = server.address();
  if (typeof address !== 'object' || address === null) throw new Error('no address');
  port = address.port;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await h.close();
});

/** Each answer on the connection: status and body as JSON. */
function answersOf(text: string): Array<{ status: number; body: Record<string, unknown> }> {
  const answers = [];
  let rest = text;
  while (rest.startsWith('HTTP/1.1 ')) {
    const headEnd = rest.indexOf('\r\n\r\n');
    const head = rest.slice(0, headEnd);
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1]);
    const body = rest.slice(headEnd + 4, headEnd + 4 + length);
    answers.push({ status: Number(head.slice(9, 12)), body: JSON.parse(body) as Record<string, unknown> });
    rest = rest.slice(headEnd + 4 + length);
  }
  return answers;
}

it.each([
  ['bytes that are not HTTP/1.1', 'NOT HTTP AT ALL\r\n\r\n', 400, 'malformed_request'],
  [
    'a request with more than 16 KiB of headers',
    `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(17 * 1024)}\r\n\r\n`,
    431,
    'headers_too_large',
  ],
] as const)(
  'a decision followed by %s gets its own 200 first, then the refusal',
  async (_what, garbage, status, code) => {
    const { id: itemId } = await h.admin
      .insertInto('enterprise.work_items')
      .values({ site_id: lab, title: 'Pipelined decision', severity: 'low' })
      .returning('id')
      .executeTakeFirstOrThrow();
    const body = JSON.stringify({ decision: 'accept', note: 'pipelined' });
    const decision =
      `POST /sites/${lab}/work-items/${itemId}/decision HTTP/1.1\r\nHost: x\r\n` +
      `Authorization: Bearer ${alice}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    const answer = await rawHttpExchange(port, decision + garbage);
    const answers = answersOf(answer.text);
    expect(answers).toMatchObject([
      { status: 200, body: { work_item_id: itemId, status: 'accepted', note: 'pipelined' } },
      { status, body: { status, code } },
    ]);
    // The decision the first answer reports is the one committed.
    const row = await h.admin
      .selectFrom('enterprise.work_items')
      .select('state')
      .where('id', '=', itemId)
      .executeTakeFirstOrThrow();
    expect(row.state).toBe('accepted');
  },
);
