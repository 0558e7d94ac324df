/** One finding of a validator: the file (and where useful the document or object) and what is wrong. */
export interface Problem {
  file: string;
  message: string;
}

export function formatProblems(problems: readonly Problem[]): string {
  return problems.map((p) => `${p.file}: ${p.message}`).join('\n');
}
