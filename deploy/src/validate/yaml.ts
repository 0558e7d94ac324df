import { parseAllDocuments } from 'yaml';

export interface YamlOptions {
  /**
   * YAML 1.1 is what Kubernetes reads (sigs.k8s.io/yaml over go-yaml): `0440` is octal there, a
   * decimal 440 in YAML 1.2. Compose reads YAML 1.2 with merge keys.
   */
  version: '1.1' | '1.2';
}

/** Every document of a YAML stream as plain data; throws with the parser's messages on a syntax error. */
export function parseYamlDocuments(text: string, options: YamlOptions): unknown[] {
  const docs = parseAllDocuments(text, { version: options.version, merge: true, uniqueKeys: true });
  if (!Array.isArray(docs)) return [];
  const values: unknown[] = [];
  for (const doc of docs) {
    if (doc.errors.length > 0) throw new Error(doc.errors.map((e) => e.message).join('; '));
    const value: unknown = doc.toJS({ maxAliasCount: 100 });
    if (value !== null && value !== undefined) values.push(value);
  }
  return values;
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
