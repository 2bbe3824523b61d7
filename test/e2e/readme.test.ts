/**
 * The README's walkthrough, run from the README's own text, so that the README cannot drift from the code.
 *
 * Three machines are played by the firewall of test/helpers/firewall.ts: the Proxy machine (a network namespace,
 * and a mount namespace where /var/lib is an empty tmpfs, so that the embedded defaults, /var/lib/gateway and
 * port 443, are really used and touch nothing of this machine), the agent machine (a namespace whose only way out
 * is squid, with PostgreSQL on its 127.0.0.1:5432) and alice's laptop (this namespace). Each shell line runs as
 * written, with the checkout as its working directory; only these are replaced by the test's own:
 *   gateway.example.com      the Proxy machine's address (no DNS here)
 *   squid.corp.example:3128  the test's squid
 *   /etc/gateway.yaml, /var/lib/gateway-agent   files of the agent machine, kept in a temporary directory
 *   <token>, <pin>           what `gwctl tokens add` printed
 * Programs are looked up on the PATH the lines themselves set (export PATH="$PWD/bin:$PATH"). The walkthrough
 * needs root (namespaces, port 443, PostgreSQL as its system user); "Start here" is checked for any user.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants, readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPostgres, type DatabaseServer } from '../helpers/databases.js';
import { createFirewall, type Firewall } from '../helpers/firewall.js';
import { rootSuite } from '../helpers/root.js';
import { codeBlocks, parseShell, type ShellLine } from '../helpers/shell.js';
import { startSquid, type Squid } from '../helpers/squid.js';

const ROOT = new URL('../../', import.meta.url).pathname.replace(/\/$/, '');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const WALKTHROUGH = 'Put an agent behind squid and connect psql to its database';
const PASSWORD = 'alice has a long password';
const DB_PASSWORD = 'orders-secret-1';

let fw: Firewall;
let dir: string;
let squid: Squid;
let pg: DatabaseServer | undefined;
let replace: Array<[string, string]>;
const background: ChildProcess[] = [];

interface Output {
  status: number | null;
  stdout: string;
  stderr: string;
}

function which(program: string, env: Record<string, string | undefined>): string {
  if (program.includes('/')) return program;
  for (const d of (env.PATH ?? '').split(':')) {
    try {
      accessSync(join(d, program), constants.X_OK);
      return join(d, program);
    } catch {
      // not here
    }
  }
  throw new Error(`${program}: command not found on the README's PATH (${env.PATH})`);
}

function substitute(text: string): string {
  return replace.reduce((t, [from, to]) => t.replaceAll(from, to), text);
}

/** Runs argv (already substituted) with `prefix` (a namespace entry) to completion. */
function run(prefix: string[], argv: string[], env: Record<string, string | undefined>, input = ''): Promise<Output> {
  return new Promise((resolve, reject) => {
    const [cmd, ...args] = [...prefix, which(argv[0]!, env), ...argv.slice(1)];
    const child = spawn(cmd!, args, { cwd: ROOT, env: env as NodeJS.ProcessEnv, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.once('error', reject);
    child.once('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
    child.stdin.end(input);
  });
}

/** Starts argv in the background and resolves once its output matches `ready`. */
function runInBackground(prefix: string[], argv: string[], env: Record<string, string | undefined>, ready: RegExp): Promise<{ child: ChildProcess; output: () => string }> {
  const [cmd, ...args] = [...prefix, which(argv[0]!, env), ...argv.slice(1)];
  const child = spawn(cmd!, args, { cwd: ROOT, env: env as NodeJS.ProcessEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  background.push(child);
  let output = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${argv.join(' ')} did not get ready:\n${output}`)), 45_000);
    const check = (c: Buffer) => {
      output += c.toString();
      if (ready.test(output)) {
        clearTimeout(timer);
        resolve({ child, output: () => output });
      }
    };
    child.stdout!.on('data', check);
    child.stderr!.on('data', check);
    child.once('exit', (code) => reject(new Error(`${argv.join(' ')} exited with ${code}:\n${output}`)));
  });
}

const commands = (lines: ShellLine[]) => lines.filter((l): l is Extract<ShellLine, { kind: 'command' }> => l.kind === 'command');

describe('the README', () => {
  it('"Start here" runs the package scripts that exist, and puts bin/ with the four commands on PATH', () => {
    const blocks = codeBlocks(README, 'Start here').map((b) => b.body.trim());
    expect(blocks.slice(0, 3)).toEqual(['npm ci && npm start', 'npm ci && npm test', 'export PATH="$PWD/bin:$PATH"']);
    // The fourth gives the first admin the maintenance window: test/web/logic.test.ts and web-browser.test.ts run it.
    expect(blocks.slice(3)).toEqual([expect.stringMatching(/^gwctl create -f - <<'EOF'\n[\s\S]*\ngwctl users update alice /)]);
    const scripts = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts;
    expect(scripts.start).toBeDefined();
    expect(scripts.test).toBeDefined();
    expect(scripts.prepare, 'npm ci must build the commands bin/ runs').toContain('build');
    for (const name of ['gateway', 'gwctl', 'gwsh', 'gateway-upgrade']) {
      expect(which(name, { PATH: join(ROOT, 'bin') })).toBe(join(ROOT, 'bin', name));
    }
  });
});

rootSuite(['netns', 'mountns', 'port443', 'dbUsers'])('the README walkthrough', () => {
  beforeAll(async () => {
    fw = await createFirewall();
    dir = await mkdtemp(join(tmpdir(), 'gw-readme-'));
    await chmod(dir, 0o755);
    squid = await startSquid({ host: fw.agentGatewayIp, extraConfig: [`acl agent_net src ${fw.agentIp}/32`, 'http_access allow agent_net'] });
    pg = await startPostgres({ netns: fw.agentNs, port: 5432, user: 'orders_app', database: 'orders', password: DB_PASSWORD });
    replace = [
      ['/var/lib/gateway-agent', join(dir, 'agent-data')],
      ['/etc/gateway.yaml', join(dir, 'agent-gateway.yaml')],
      ['squid.corp.example:3128', `${fw.agentGatewayIp}:${squid.port}`],
      ['gateway.example.com', fw.proxyIp],
    ];
  }, 90_000);

  afterAll(async () => {
    for (const c of background) c.kill('SIGTERM');
    await pg?.stop();
    await squid?.stop();
    await fw?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('works as written: token, user, agent behind squid, gwsh login, db ls, proxy db, psql', async () => {
    const blocks = codeBlocks(README, WALKTHROUGH);
    expect(blocks.map((b) => b.lang)).toEqual(['sh', 'yaml', 'sh', 'sh']);
    const [proxyBlock, agentYaml, agentBlock, laptopBlock] = blocks as [typeof blocks[0], typeof blocks[0], typeof blocks[0], typeof blocks[0]];

    // --- the Proxy machine ---------------------------------------------------------------------------------
    const proxyEnv: Record<string, string | undefined> = { PATH: process.env.PATH, PWD: ROOT, HOME: join(dir, 'proxy-home') };
    const proxyLines = parseShell(substitute(proxyBlock.body), proxyEnv);
    const [start, tokensAdd, usersAdd, ...rest] = commands(proxyLines);
    expect(rest).toEqual([]);
    expect(start!.background).toBe(true);
    const machine = ['ip', 'netns', 'exec', fw.proxyNs, 'unshare', '--mount', '--propagation', 'private', 'sh', '-c', 'mount -t tmpfs -o mode=0755 gw-readme /var/lib && exec "$@"', 'sh'];
    const proxy = await runInBackground(machine, start!.argv, proxyEnv, /CA pin\s+sha256:[0-9a-f]{64}\n/);
    expect(proxy.output()).toMatch(/data directory\s+\/var\/lib\/gateway\n/);
    expect(proxy.output()).toMatch(/every protocol\s+0\.0\.0\.0:443\n/);
    const onProxy = ['nsenter', '-t', String(proxy.child.pid), '-m', '-n', '--'];

    const added = await run(onProxy, tokensAdd!.argv, proxyEnv);
    expect(added.stderr).toBe('');
    const token = /The invite token: (\S+)/.exec(added.stdout)![1]!;
    const pin = /CA pin: (sha256:[0-9a-f]{64})/.exec(added.stdout)![1]!;
    const printed = added.stdout.split('\n').map((l) => l.trim()).find((l) => l.startsWith('gateway start'))!;
    const user = await run(onProxy, usersAdd!.argv, proxyEnv, `${PASSWORD}\n`);
    expect(user.stderr).toBe('');
    expect(user.status).toBe(0);

    // --- the agent machine: the README's command is the one gwctl printed --------------------------------------
    await writeFile(substitute('/etc/gateway.yaml'), agentYaml.body);
    const asPrinted = printed.replaceAll(token, '<token>').replaceAll(pin, '<pin>').replaceAll(fw.proxyIp, 'gateway.example.com');
    const agentCommandLine = agentBlock.body.split('\n').find((l) => l.startsWith('gateway start'))!;
    expect(asPrinted).toBe(agentCommandLine.trim());
    const agentEnv: Record<string, string | undefined> = { PATH: proxyEnv.PATH, PWD: ROOT, HOME: join(dir, 'agent-home') };
    const agentLines = parseShell(substitute(agentBlock.body).replaceAll('<token>', token).replaceAll('<pin>', pin), agentEnv);
    expect(agentLines[0]).toEqual({ kind: 'export', name: 'HTTPS_PROXY', value: `http://${fw.agentGatewayIp}:${squid.port}` });
    const [agentStart] = commands(agentLines);
    await runInBackground(['ip', 'netns', 'exec', fw.agentNs], agentStart!.argv, agentEnv, /reverse tunnel ready/);
    await squid.waitForAccessLog((l) => l.includes(`CONNECT ${fw.proxyIp}:443`));

    // --- alice's laptop (this namespace; it reaches the Proxy directly). The pin without its prefix. ----------
    const laptopEnv: Record<string, string | undefined> = { PATH: proxyEnv.PATH, PWD: ROOT, HOME: join(dir, 'alice'), PGPASSWORD: DB_PASSWORD };
    const laptop = commands(parseShell(substitute(laptopBlock.body).replaceAll('<pin>', pin.slice('sha256:'.length)), laptopEnv));
    expect(laptop.map((l) => l.argv[0])).toEqual(['gwsh', 'gwsh', 'gwsh', 'psql']);
    const login = await run([], laptop[0]!.argv, laptopEnv, `${PASSWORD}\n`);
    expect(login.stderr).toBe('');
    expect(login.status).toBe(0);
    const ls = await run([], laptop[1]!.argv, laptopEnv);
    expect(ls.stdout).toMatch(/orders\s+postgres/);
    expect(ls.stdout).toContain('env=prod');
    expect(laptop[2]!.background).toBe(true);
    await runInBackground([], laptop[2]!.argv, laptopEnv, /Started a local proxy/);
    const psql = await run([], laptop[3]!.argv, laptopEnv, 'SELECT current_user, current_database();\n');
    expect(psql.stderr).toBe('');
    expect(psql.stdout).toMatch(/orders_app\s+\|\s+orders\n/);
  }, 180_000);
});
