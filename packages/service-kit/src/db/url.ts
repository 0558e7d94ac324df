/** `baseUrl` (a PostgreSQL connection URL) naming `database` instead of its own database. */
export function databaseUrl(baseUrl: string, database: string): string {
  const url = new URL(baseUrl);
  url.pathname = `/${encodeURIComponent(database)}`;
  return url.toString();
}
