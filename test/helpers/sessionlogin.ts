/**
 * The login the tests' SSH sessions and terminals use on an agent that runs as root.
 *
 * A session runs the account's shell, and bash started for a session reads the account's dotfiles (a login shell
 * its profile; a command over SSH its ~/.bashrc, since SSH_CLIENT is set). Root's dotfiles belong to the machine,
 * not the project: on the CI image root's ~/.bashrc runs `pyenv init`, which rehashes under a lock file, and a
 * root shell killed mid-rehash (as a test that closes 100 terminals at once does) leaves that lock behind; every
 * later root shell then waits 60 s for it. So when the tests run as root their sessions log in as an account of
 * their own, made here with the distribution's useradd and an /etc/skel home; as a normal user they log in as
 * that user (an agent that is not root can only run sessions as itself).
 */
import { spawnSync } from 'node:child_process';
import { userInfo } from 'node:os';
import { IS_ROOT } from './root.js';

const NAME = 'gw-session';

function exists(name: string): boolean {
  return spawnSync('id', ['-u', name], { stdio: 'ignore' }).status === 0;
}

function ensureAccount(): string {
  if (exists(NAME)) return NAME;
  const r = spawnSync('useradd', ['--create-home', '--shell', '/bin/bash', '--user-group', NAME], { encoding: 'utf8' });
  // Two test files may race to create it: the loser's "already exists" is fine.
  if (r.status !== 0 && !exists(NAME)) throw new Error(`useradd ${NAME} failed (${r.status}): ${r.stderr || r.error?.message}`);
  return NAME;
}

/** The login for sessions: the tests' own account as root, else the user running the tests. */
export function sessionLogin(): string {
  return IS_ROOT ? ensureAccount() : userInfo().username;
}
