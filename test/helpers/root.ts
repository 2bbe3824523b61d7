/**
 * Tests that need root, decided in one place.
 *
 * CI runs every test as root. A developer who runs `npm test` as a normal user gets every test that can run
 * without privileges; each suite or test that cannot is skipped, and says why in its name: "(needs root: network
 * namespaces, port 443)". test/helpers/root-reporter.ts counts them at the end of the run and says how to run
 * everything. As root nothing here skips anything.
 *
 * Use it only for what really needs root; a test that can run as any user must (see UNPRIVILEGED_USER in
 * asuser.ts for a test about a normal user, which as non-root is the user running the tests).
 */
import { describe, it, type TestFunction } from 'vitest';
import { NEEDS_ROOT_MARK } from './root-reporter.js';

export const IS_ROOT = process.getuid?.() === 0;

/** What a suite needs root for, one entry per privilege; the text goes into the suite's name. */
export const ROOT_NEEDS = {
  netns: 'network namespaces',
  mountns: 'a mount namespace',
  port443: 'port 443',
  port80: 'port 80',
  users: 'OS users of its own',
  setuid: 'running as another user',
  dbUsers: 'databases as their system users',
  chown: 'chown to another user',
  chroot: 'chroot (rpm --root runs scriptlets there)',
} as const;

export type RootNeed = keyof typeof ROOT_NEEDS;

/** " (needs root: network namespaces, port 443)": the reason, as it is added to a name. */
export function needsRoot(needs: readonly RootNeed[]): string {
  if (needs.length === 0) throw new Error('needsRoot: say what root is needed for');
  return ` ${NEEDS_ROOT_MARK}${needs.map((n) => ROOT_NEEDS[n]).join(', ')})`;
}

/**
 * describe() for suites that need root for `needs`: they run as root and are skipped, with the reason in their
 * name, for any other user. Their beforeAll/afterAll hooks do not run when skipped (nor do a file's top-level
 * hooks when every suite in it is skipped).
 */
export function rootSuite(needs: readonly RootNeed[]): (name: string, fn: () => void) => void {
  const reason = needsRoot(needs);
  return (name, fn) => describe.skipIf(!IS_ROOT)(`${name}${reason}`, fn);
}

/** it() for single tests that need root for `needs`, skipped with the reason in their name for other users. */
export function rootTest(needs: readonly RootNeed[]): (name: string, fn: TestFunction, timeout?: number) => void {
  const reason = needsRoot(needs);
  return (name, fn, timeout) => it.skipIf(!IS_ROOT)(`${name}${reason}`, fn, timeout);
}
