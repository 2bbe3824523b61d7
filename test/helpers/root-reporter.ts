/**
 * A vitest reporter (vitest.config.ts) that ends a run by a normal user with what was skipped because it needs
 * root (root.ts names such suites and tests "... (needs root: ...)"): one line per test file with the count and
 * the reasons, then one line with the totals and how to run everything. It prints nothing when nothing was
 * skipped for that reason, so nothing as root.
 */
import { userInfo } from 'node:os';
import { relative } from 'node:path';
import type { Reporter, TestCase, TestModule, TestSuite, Vitest } from 'vitest/node';

/**
 * The start of the reason root.ts adds to the name of a suite or test that needs root. Defined here, not in
 * root.ts, because a reporter runs in vitest's main process, where importing vitest itself (as root.ts does)
 * fails.
 */
export const NEEDS_ROOT_MARK = '(needs root: ';

const reasonOf = (t: TestSuite | TestCase): string | undefined => {
  const at = t.name.lastIndexOf(NEEDS_ROOT_MARK);
  return at < 0 ? undefined : t.name.slice(at + NEEDS_ROOT_MARK.length, t.name.lastIndexOf(')'));
};

/** Whether a suite or test is skipped for root, and no suite around it already was (it is counted once). */
function skippedForRoot(t: TestSuite | TestCase): boolean {
  const skipped = t.type === 'suite' ? t.state() === 'skipped' : t.result().state === 'skipped';
  if (!skipped || reasonOf(t) === undefined) return false;
  for (let p = t.parent; p.type === 'suite'; p = p.parent) if (reasonOf(p) !== undefined) return false;
  return true;
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;
const counts = (suites: number, tests: number) =>
  [suites ? plural(suites, 'suite') : '', tests ? plural(tests, 'test') : ''].filter(Boolean).join(' and ');

/** What to print for these modules (paths relative to `root`), or [] when nothing was skipped for root. */
export function rootSkipSummary(modules: ReadonlyArray<TestModule>, root: string, user = userInfo().username): string[] {
  const lines: string[] = [];
  let [suites, tests] = [0, 0];
  for (const m of modules) {
    const skipped = [...m.children.allSuites(), ...m.children.allTests()].filter(skippedForRoot);
    if (skipped.length === 0) continue;
    const [s, t] = [skipped.filter((x) => x.type === 'suite').length, skipped.filter((x) => x.type === 'test').length];
    const reasons = [...new Set(skipped.flatMap((x) => reasonOf(x)!.split(', ')))].join(', ');
    lines.push(`  ${relative(root, m.moduleId)}: ${counts(s, t)} (${reasons})`);
    [suites, tests] = [suites + s, tests + t];
  }
  if (lines.length === 0) return [];
  return [
    `Skipped as ${user} because they need root:`,
    ...lines,
    `${counts(suites, tests)} in ${plural(lines.length, 'file')} skipped because they need root (the tests run as ${user}).` +
      ' To run everything: sudo npm test in a clone that root owns, as CI does.',
  ];
}

export default class RootSkipReporter implements Reporter {
  private vitest: Vitest | undefined;
  private lines: string[] = [];

  onInit(vitest: Vitest): void {
    this.vitest = vitest;
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    this.lines = rootSkipSummary(modules, this.vitest?.config.root ?? process.cwd());
  }

  /** Printed here rather than in onTestRunEnd: vitest calls onFinished after it, so this comes after the summary. */
  onFinished(): void {
    if (this.lines.length > 0) this.vitest?.logger.log(`${this.lines.join('\n')}\n`);
  }
}
