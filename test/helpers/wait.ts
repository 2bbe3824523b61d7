/** Waiting for something a real daemon does asynchronously, with a bound: the one polling helper of the e2e tests. */

/** Resolves once check() is true; rejects naming `what` when timeoutMs passes first. No timing is asserted. */
export async function waitUntil(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000, everyMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * Resolves with fn's first result; a rejection is retried every everyMs until timeoutMs passes, then the error
 * names `what` and the last rejection. No timing is asserted.
 */
export async function eventually<T>(what: string, fn: () => Promise<T>, timeoutMs = 30_000, everyMs = 250): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms; last: ${last instanceof Error ? last.message : String(last)}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
