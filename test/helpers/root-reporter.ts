/**
 * A vitest reporter (vitest.config.ts) that ends a run by a normal user with one line: how many suites and tests
 * were skipped because they need root (root.ts names them "(needs root: ...)"), and how to run everything. It
 * prints nothing when nothing was skipped for that reason, so nothing as root.
 */
import { userInfo } from 'node:os';
import type { Reporter, TestCase, TestModule, TestSuite, Vitest } from 'vitest/node';

/**
 * The start of the reason root.ts adds to the name of a suite or test that needs root. Defined here, not in
 * root.ts, because a reporter runs in vitest's main process, where importing vitest itself (as root.ts does)
 * fails.
 */
export const NEEDS_ROOT_MARK = '(needs root: ';

const marked = (t: TestSuite | TestCase) => t.name.includes(NEEDS_ROOT_MARK);

/** Whether a suite or test is skipped for root, and no suite around it already was (it is counted once). */
function skippedForRoot(t: TestSuite | TestCase): boolean {
  const skipped = t.type === 'suite' ? t.state() === 'skipped' : t.result().state === 'skipped';
  if (!skipped || !marked(t)) return false;
  for (let p = t.parent; p.type === 'suite'; p = p.parent) if (marked(p)) return false;
  return true;
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;

/** The line for these modules, or undefined when nothing was skipped for root. */
export function rootSkipSummary(modules: ReadonlyArray<TestModule>, user = userInfo().username): string | undefined {
  let suites = 0;
  let tests = 0;
  const files = new Set<string>();
  for (const m of modules) {
    for (const s of m.children.allSuites()) if (skippedForRoot(s)) (suites++, files.add(m.moduleId));
    for (const t of m.children.allTests()) if (skippedForRoot(t)) (tests++, files.add(m.moduleId));
  }
  if (suites + tests === 0) return undefined;
  const what = [suites ? plural(suites, 'suite') : '', tests ? plural(tests, 'test') : ''].filter(Boolean).join(' and ');
  return (
    `Skipped ${what} in ${plural(files.size, 'file')} because they need root and the tests run as ${user}; each says` +
    ` why in its name, "${NEEDS_ROOT_MARK}...)". To run everything: sudo npm test in a clone that root owns, as CI does.`
  );
}

export default class RootSkipReporter implements Reporter {
  private vitest: Vitest | undefined;
  private line: string | undefined;

  onInit(vitest: Vitest): void {
    this.vitest = vitest;
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    this.line = rootSkipSummary(modules);
  }

  /** Printed here rather than in onTestRunEnd: vitest calls onFinished after it, so the line comes after the summary. */
  onFinished(): void {
    if (this.line) this.vitest?.logger.log(`${this.line}\n`);
  }
}
