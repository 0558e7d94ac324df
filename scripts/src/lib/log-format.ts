// LOG_FORMAT for `npm start`: the services always write JSON lines (service-kit's logger; what production
// collects), which are hard to read in a terminal. With LOG_FORMAT=pretty the stack reads its services' output
// and prints each line as text instead:
//
//   16:39:52.921 warn  enterprise-workflow  http request  method=GET route=/ready status=503 duration_ms=52.4 …
//
// time (UTC, from the line's timestamp), level, service, message, then the other fields in the order they came,
// as key=value (a value with spaces, quotes or that is not a string in JSON). A line that is not a JSON object
// is printed as it is.

export const LOG_FORMATS = ['json', 'pretty'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

/** LOG_FORMAT's value, `json` when unset; throws naming the choices otherwise. */
export function logFormatFrom(value: string | undefined): LogFormat {
  if (value === undefined || value === '') return 'json';
  const format = LOG_FORMATS.find((f) => f === value);
  if (format === undefined) throw new Error(`LOG_FORMAT must be ${LOG_FORMATS.join(' or ')}, not "${value}"`);
  return format;
}

/** Fields shown in their own columns, not as key=value. */
const COLUMNS = new Set(['timestamp', 'level', 'service', 'message']);

function fieldText(value: unknown): string {
  if (typeof value === 'string' && /^[^\s"=]+$/.test(value)) return value;
  return JSON.stringify(value) ?? String(value);
}

/** One line of a service's output as text (see above); not JSON, it is returned as it is. */
export function prettyLogLine(line: string): string {
  let entry: unknown;
  try {
    entry = JSON.parse(line);
  } catch {
    return line;
  }
  if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) return line;
  const fields = entry as Record<string, unknown>;
  const timestamp = typeof fields.timestamp === 'string' ? fields.timestamp : '';
  // ISO 8601 from winston's timestamp format: the time of day is enough beside a running stack.
  const time = /T(\d\d:\d\d:\d\d(?:\.\d+)?)/.exec(timestamp)?.[1] ?? timestamp;
  const level = typeof fields.level === 'string' ? fields.level : '?';
  const service = typeof fields.service === 'string' ? fields.service : '';
  const message = typeof fields.message === 'string' ? fields.message : fieldText(fields.message);
  const rest = Object.entries(fields)
    .filter(([key, value]) => !COLUMNS.has(key) && value !== undefined)
    .map(([key, value]) => `${key}=${fieldText(value)}`);
  return [time, level.padEnd(5), service, ' ' + message, ...(rest.length > 0 ? [' ' + rest.join(' ')] : [])]
    .filter((part) => part !== '')
    .join(' ');
}
