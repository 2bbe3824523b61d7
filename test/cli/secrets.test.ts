/**
 * Secrets stay private whatever the umask: `gwctl get --with-secrets` written with -o or redirected to a file,
 * and the daemon's log file (issue: hardening, "secrets stay private").
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIN, runCli } from '../helpers/gateway.js';

let dir: string;
let dataDir: string;
let daemon: ChildProcess;
const SECRET = 'oidc-client-secret-do-not-leak';

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-secrets-'));
  dataDir = join(dir, 'data');
  const config = join(dir, 'gateway.yaml');
  await writeFile(
    config,
    [
      'gateway:',
      `  data_dir: ${dataDir}`,
      `  log: { output: ${join(dir, 'logs', 'gateway.log')}, format: json }`,
      'auth_service:',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      '  web_listen_addr: 127.0.0.1:0',
      '',
    ].join('\n'),
  );
  // Under umask 000 every file would be world-writable unless the gateway sets its modes itself.
  daemon = spawn('sh', ['-c', `umask 000; exec ${process.execPath} ${BIN('gateway')} start -c ${config}`], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  await new Promise<void>((resolve, reject) => {
    daemon.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      if (/CA pin\s+sha256:/.test(out)) resolve();
    });
    daemon.stderr!.on('data', (c: Buffer) => (out += c.toString()));
    daemon.once('exit', (code) => reject(new Error(`gateway exited with ${code}: ${out}`)));
  });
  await writeFile(
    join(dir, 'oidc.yaml'),
    `kind: oidc\nversion: v3\nmetadata: {name: corp}\nspec:\n  issuer_url: https://idp.example.com\n  client_id: gw\n  client_secret: ${SECRET}\n  redirect_url: https://gw.example.com/v1/webapi/oidc/callback\n  claims_to_roles:\n    - {claim: groups, value: admins, roles: [editor]}\n`,
  );
  const created = await runCli('gwctl', ['--data-dir', dataDir, 'create', join(dir, 'oidc.yaml')]);
  expect(created.stderr).toBe('');
}, 60_000);

afterAll(async () => {
  if (daemon && daemon.exitCode === null) {
    const exited = new Promise((r) => daemon.once('exit', r));
    daemon.kill('SIGTERM');
    await exited;
  }
  await rm(dir, { recursive: true, force: true });
});

/** gwctl under umask 000, through a shell, as a user types it. */
function gwctlInShell(command: string) {
  return spawnSync('sh', ['-c', `umask 000; ${command}`], { encoding: 'utf8', env: { PATH: process.env.PATH ?? '', GWCTL: `${process.execPath} ${BIN('gwctl')} --data-dir ${dataDir}` } });
}

describe('secrets stay private', () => {
  it('gwctl get --with-secrets -o FILE writes the file 0600', async () => {
    const file = join(dir, 'out', 'connectors.yaml');
    const r = gwctlInShell(`$GWCTL get oidc --with-secrets -o ${file}`);
    expect(r.stderr).toContain('contains secrets');
    expect(r.status).toBe(0);
    expect(await readFile(file, 'utf8')).toContain(SECRET);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
  });

  it('gwctl get --with-secrets > FILE: the shell made it 0666, gwctl makes it 0600', async () => {
    const file = join(dir, 'redirected.yaml');
    const r = gwctlInShell(`$GWCTL get oidc --with-secrets > ${file}`);
    expect(r.status).toBe(0);
    expect(await readFile(file, 'utf8')).toContain(SECRET);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
  });

  it('without --with-secrets the secret is not printed and a redirected file keeps its mode', async () => {
    const file = join(dir, 'plain.yaml');
    const r = gwctlInShell(`$GWCTL get oidc > ${file}`);
    expect(r.status).toBe(0);
    expect(await readFile(file, 'utf8')).not.toContain(SECRET);
    expect((await stat(file)).mode & 0o777).toBe(0o666);
  });

  it('the log file is 0600 under umask 000, in a directory only its owner can enter', async () => {
    const log = join(dir, 'logs', 'gateway.log');
    expect((await stat(log)).mode & 0o777).toBe(0o600);
    expect((await stat(join(dir, 'logs'))).mode & 0o777).toBe(0o700);
    expect(await readFile(log, 'utf8')).toContain('gateway started');
  });
});
