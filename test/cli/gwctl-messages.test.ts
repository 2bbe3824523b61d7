/**
 * gwctl's messages point at the real fix (the built CLI, a running Auth Service). `gwctl users add` on a terminal
 * (a real pty): the password is typed twice; two that differ are said to differ and asked for again, at most 3
 * times, then GW_ERR_CLIENT_PASSWORD_MISMATCH with nothing created. `gwctl create` of a file it cannot read says
 * to check the path, not to read --help.
 */
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as nodePty from 'node-pty';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { waitUntil } from '../helpers/wait.js';

let gw: RunningGateway;
beforeAll(async () => {
  gw = await startGateway('gateway:\n  data_dir: DATA_DIR\nauth_service:\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n');
}, 60_000);
afterAll(async () => {
  await gw?.stop();
});

/** gwctl users add NAME on a terminal; answers each prompt with the next of answers. Resolves with its output and status. */
async function addOnTerminal(name: string, answers: string[]): Promise<{ output: string; status: number }> {
  const term = nodePty.spawn(process.execPath, [BIN('gwctl'), '--data-dir', gw.dataDir, 'users', 'add', name, '--roles=access'], { cols: 200, rows: 50, env: process.env as Record<string, string> });
  let output = '';
  let prompts = 0;
  const exited = new Promise<number>((resolve) => term.onExit(({ exitCode }) => resolve(exitCode)));
  term.onData((d) => {
    output += d;
    // Each prompt ends with ": " and waits; answer it once.
    const seen = (output.match(/(Password for \S+|Confirm password): /g) ?? []).length;
    while (prompts < seen && prompts < answers.length) term.write(`${answers[prompts++]}\r`);
  });
  try {
    return { status: await exited, output };
  } finally {
    term.kill();
  }
}

const userExists = async (name: string) => (await runCli('gwctl', ['--data-dir', gw.dataDir, 'users', 'ls'])).stdout.includes(name);

describe('gwctl users add: two passwords that differ', () => {
  it('are said to differ and asked for again; typed the same the second time, the user is created', async () => {
    const r = await addOnTerminal('dora', ['first-Passw0rd', 'other-Passw0rd', 'right-Passw0rd', 'right-Passw0rd']);
    expect(r.output).toContain('The two passwords did not match; type them again (2 tries left).');
    expect(r.output).not.toContain('--help');
    expect(r.status, r.output).toBe(0);
    expect(r.output).toContain('user "dora" has been created');
    await waitUntil('dora is listed', () => userExists('dora'));
  });

  it('three times: GW_ERR_CLIENT_PASSWORD_MISMATCH, exit 1, nothing created; run again with the same password twice, created', async () => {
    const r = await addOnTerminal('erin', ['a-Passw0rd-1', 'b-Passw0rd-1', 'a-Passw0rd-2', 'b-Passw0rd-2', 'a-Passw0rd-3', 'b-Passw0rd-3']);
    expect(r.status).toBe(1);
    expect(r.output).toContain('the two passwords did not match, 3 times; nothing was changed');
    expect(r.output).toContain('code: GW_ERR_CLIENT_PASSWORD_MISMATCH');
    expect(r.output).toMatch(/hint: Run the command again and type the same password twice/);
    expect(r.output).not.toContain('--help');
    expect(await userExists('erin')).toBe(false);
    const again = await addOnTerminal('erin', ['same-Passw0rd', 'same-Passw0rd']);
    expect(again.status, again.output).toBe(0);
    expect(await userExists('erin')).toBe(true);
  });
});

describe('gwctl create of a manifest it cannot read', () => {
  it('says to check the path (not --help); with the file where it was named, the same command creates the role', async () => {
    const file = join(gw.dir, 'auditor-role.yaml');
    const create = () => runCli('gwctl', ['--data-dir', gw.dataDir, 'create', file]);
    const r = await create();
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(`error: cannot read ${file}: ENOENT`);
    expect(r.stderr).toMatch(/^hint: Check the path of the manifest and that this user can read it/m);
    expect(r.stderr).not.toContain('--help');
    await writeFile(file, ['kind: role', 'version: v7', 'metadata: {name: auditor}', 'spec:', '  allow:', '    logins: [auditor]', ''].join('\n'));
    const again = await create();
    expect(again.status, again.stderr).toBe(0);
  });
});

describe('gwctl users add: a password that is not one (the prompt reads at most PROMPT_MAX)', () => {
  it('hostile: 1 MiB on standard input with no newline is refused without reading it all, nothing created; the password alone on its line creates the user', async () => {
    const flood = 'x'.repeat(1024 * 1024);
    const r = await runCli('gwctl', ['--data-dir', gw.dataDir, 'users', 'add', 'fred', '--roles=access'], { input: flood });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('the first line of standard input is longer than 4096 characters: not a password; nothing was changed');
    expect(r.stderr).toMatch(/^hint: Give the password alone as the first line of standard input/m);
    expect(await userExists('fred')).toBe(false);
    const again = await runCli('gwctl', ['--data-dir', gw.dataDir, 'users', 'add', 'fred', '--roles=access'], { input: 'fred-Passw0rd-ok\r\n' });
    expect(again.status, again.stderr).toBe(0);
    expect(await userExists('fred')).toBe(true);
  });

  it('hostile: on a terminal, typing past the cap is refused the same way, nothing created', async () => {
    const r = await addOnTerminal('gina', ['y'.repeat(5000)]);
    expect(r.status).toBe(2);
    expect(r.output).toContain('the password typed is longer than 4096 characters');
    expect(await userExists('gina')).toBe(false);
  });
});
