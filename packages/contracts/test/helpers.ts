import type { FieldError, Validation } from '@platform/contracts';

/** The errors of a rejected document; fails the test when the document was accepted. */
export function errorsOf<T>(result: Validation<T>): FieldError[] {
  if (result.ok) throw new Error(`expected a rejection, got ${JSON.stringify(result.value)}`);
  return result.errors;
}

export function pathsOf<T>(result: Validation<T>): string[] {
  return errorsOf(result).map((e) => e.path);
}
