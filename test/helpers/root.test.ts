/**
 * The reporter that ends a normal user's run with the count of suites skipped because they need root, in real
 * vitest runs of fixtures (fixtures/root-reporter/) whose suites are skipped as root.ts skips them for a normal
 * user.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { needsRoot } from './root.js';

const FIXTURES = fileURLToPath(new URL('../../fixtures/root-reporter/', import.meta.url));
const VITEST = fileURLToPath(new URL('../../node_modules/vitest/vitest.mjs', import.meta.url));
const cache = mkdtempSync(join(tmpdir(), 'gw-root-reporter-'));
afterAll(() => rmSync(cache, { recursive: true, force: true }));

function runFixture(file: string): { status: number | null; lines: string[] } {
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? tmpdir(), NO_COLOR: '1', GW_FIXTURE: file, GW_CACHE_DIR: cache };
  const r = spawnSync(process.execPath, [VITEST, 'run'], { cwd: FIXTURES, env, encoding: 'utf8' });
  return { status: r.status, lines: `${r.stdout}${r.stderr}`.split('\n').map((l) => l.trim()) };
}

describe('the root reporter', () => {
  it('lists each file with its count and reasons, counting a suite or test once, then the totals after the summary', () => {
    const { status, lines } = runFixture('skips.fixture.ts');
    expect(status).toBe(0);
    const user = userInfo().username;
    const at = lines.indexOf(`Skipped as ${user} because they need root:`);
    expect(at).toBeGreaterThan(lines.findIndex((l) => l.startsWith('Tests ')));
    expect(lines.slice(at + 1, at + 3)).toEqual([
      'skips.fixture.ts: 2 suites and 1 test (network namespaces, port 443, OS users of its own, chown to another user)',
      `2 suites and 1 test in 1 file skipped because they need root (the tests run as ${user}). To run everything: sudo npm test in a clone that root owns, as CI does.`,
    ]);
  });

  it('says nothing when nothing was skipped for root', () => {
    const { status, lines } = runFixture('none.fixture.ts');
    expect(status).toBe(0);
    expect(lines.some((l) => l.startsWith('Tests '))).toBe(true);
    expect(lines.filter((l) => l.includes('need root'))).toEqual([]);
  });
});

describe('needsRoot', () => {
  it('names each need, in the order given', () => {
    expect(needsRoot(['netns', 'port443'])).toBe(' (needs root: network namespaces, port 443)');
  });

  it('refuses to skip without a reason', () => {
    expect(() => needsRoot([])).toThrow(/say what root is needed for/);
  });
});
