/** Waiting for something a real daemon does asynchronously, with a bound: the one polling helper of the e2e tests. */

/** Resolves once check() is true; rejects naming `what` when timeoutMs passes first. No timing is asserted. */
export async function waitUntil(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000, everyMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
