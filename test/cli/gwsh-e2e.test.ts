/**
 * gwsh's --e2e flag and GWSH_E2E, with the built CLI: every command that carries a stream takes them, a bad value
 * is a usage error (exit 2, GW_ERR_USAGE, the hint naming the three values) before anything else happens (no
 * profile is needed to find it out), and the flag wins over the environment.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../helpers/gateway.js';

let home: string;
beforeAll(async () => {
  home = await mkdtemp(join(tmpdir(), 'gw-gwsh-e2e-'));
});
afterAll(async () => {
  if (home) await rm(home, { recursive: true, force: true });
});

const gwsh = (args: string[], extra: Record<string, string> = {}) => runCli('gwsh', args, { env: { GWSH_HOME: home, HOME: home, ...extra } });

const COMMANDS = [
  ['proxy', 'app', 'echo'],
  ['proxy', 'db', 'pg'],
  ['proxy', 'ssh', 'root@node1'],
  ['ssh', 'root@node1'],
];

describe('gwsh --e2e', () => {
  it.each(COMMANDS)('gwsh %s %s: a bad --e2e is a usage error naming the values', async (...args) => {
    const [first, ...rest] = args;
    const argv = first === 'ssh' ? ['ssh', '--e2e', 'always', ...rest] : [first!, ...rest, '--e2e', 'always'];
    const r = await gwsh(argv);
    expect(r.status, r.stderr).toBe(2);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
    expect(r.stderr).toMatch(/--e2e: "always" is not one of auto, require, off/);
    expect(r.stderr).toMatch(/^hint: .*require.*off/m);
  });

  it('a bad GWSH_E2E is the same error naming the variable; a good --e2e wins over it', async () => {
    const bad = await gwsh(['proxy', 'app', 'echo'], { GWSH_E2E: 'maybe' });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/GWSH_E2E: "maybe" is not one of/);
    // The flag wins: the command gets as far as the missing profile.
    const flag = await gwsh(['proxy', 'app', 'echo', '--e2e', 'off'], { GWSH_E2E: 'maybe' });
    expect(flag.stderr).toContain('code: GW_ERR_CLIENT_NOT_LOGGED_IN');
  });

  it('the flag is in the help of each command that carries streams, not of proxy desktop', async () => {
    for (const args of [['proxy', 'app'], ['proxy', 'db'], ['proxy', 'ssh'], ['ssh']]) {
      expect((await gwsh([...args, '--help'])).stdout).toMatch(/--e2e <mode>/);
    }
    expect((await gwsh(['proxy', 'desktop', '--help'])).stdout).not.toMatch(/--e2e/);
  });
});
