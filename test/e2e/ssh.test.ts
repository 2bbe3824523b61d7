/**
 * SSH through the gateway with Debian's own OpenSSH clients (ssh, scp, sftp), to an agent behind a firewall.
 *
 * Topology (test/helpers/firewall.ts, as in tunnel.test.ts): the agent daemon `web-1` (ssh_service) runs in one
 * network namespace whose only way out is a real squid in the root namespace; the Proxy (auth + proxy, TLS
 * routing: everything on one port, 443) runs in another; the root namespace does not forward between them.
 * The agent joins through squid with a token and the CA pin and keeps its reverse tunnel through it. The
 * clients run in the root namespace as a user would: `gwsh login`, `gwsh config` > a file, then
 * `ssh -F <file> alice@web-1 ...`, whose ProxyCommand is `gwsh proxy ssh` (ALPN gateway-proxy-ssh to 443) and
 * whose KnownHostsCommand is `gwsh known-hosts`. The SSH server is the agent's (ssh2); commands run as the OS
 * user `alice`, created here (and removed afterwards).
 *
 * The agent runs in a mount namespace of its own where /usr/lib/openssh is an empty directory: the node has no
 * OpenSSH sftp-server, so sftp and scp work only through the agent's built-in one (`gateway sftp-server`, run
 * as the login user). The system's sftp-server, configured with ssh_service.sftp_server, is tested too.
 *
 * Covered: a command's output, standard error and exit code; `gwsh ls`, `gwsh ssh`, `gwsh known-hosts` and a
 * host key that does not match; 256 MiB byte-exact both ways (scp over SFTP up and down, legacy scp -O down,
 * sha256 at both ends, the file owned by the login user) and an sftp batch; the sftp server process and what it
 * may touch; an interactive pty session in tmux that sees its window size change and exits
 * with 7; session audit events; refusals (a login the user does not have, a role whose node_labels do not
 * match, an expired certificate both at the Proxy and at the node, a plain key without a certificate); a node
 * whose link is cut and one whose agent stopped: a clear GW_ERR_TUNNEL_NOT_FOUND, not a hang.
 *
 * Every client runs as an asynchronous child process; nothing asserts how fast anything happens (outputs are
 * polled with generous deadlines).
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, copyFile, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createFirewall, startGatewayIn, type Firewall, type NsGateway } from '../helpers/firewall.js';
import { BIN, runCli, type RunResult } from '../helpers/gateway.js';
import { parseAccessLogLine, startSquid, type Squid } from '../helpers/squid.js';
import { runCleanup } from '../helpers/cleanup.js';
import { gatewayForAnyUser } from '../helpers/asuser.js';
import { rootSuite } from '../helpers/root.js';
import { eventually } from '../helpers/wait.js';

// Every suite here runs in the firewall's network namespaces, the agent in a mount namespace of its own, the
// Proxy on port 443, and logs in as OS users of its own: as any user but root they are skipped, with that reason.
const describeAsRoot = rootSuite(['netns', 'mountns', 'port443', 'users']);

const PROXY_NAME = 'proxy.gw.test';
const WEB_PORT = 443;
const PASSWORD = 'correct horse battery';
const OS_USER = 'alice';
const OS_USER_COMMENT = 'gateway e2e ssh test';
const BIG = 256 * 1024 * 1024;
/** Debian's sftp-server (package openssh-sftp-server), for the case that configures it. */
const SYSTEM_SFTP_SERVER = '/usr/lib/openssh/sftp-server';

let fw: Firewall;
let dir: string;
let squid: Squid;
let proxy: NsGateway;
let agent: NsGateway;
let pin: string;
let webAddr: string;
let createdOsUser = false;
let tmuxSocket: string | undefined;
/** gwsh profiles (GWSH_HOME) and the OpenSSH configuration `gwsh config` printed for each. */
const profiles: Record<'alice' | 'short' | 'carol', { env: Record<string, string>; config: string }> = {} as never;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Any program, asynchronously (spawnSync would stop this process's timers), with exactly the environment given. */
function run(command: string, args: string[], options: { env?: Record<string, string>; input?: string; timeoutMs?: number } = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env: { PATH: process.env.PATH ?? '', HOME: dir, ...(options.env ?? {}) }, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timeoutMs = options.timeoutMs ?? 60_000;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${command} ${args.join(' ')} did not finish in ${timeoutMs} ms (a hang)\nstdout: ${stdout.slice(-2000)}\nstderr: ${stderr.slice(-2000)}`));
    }, timeoutMs);
    child.once('error', reject);
    child.once('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
    child.stdin.on('error', () => undefined);
    child.stdin.end(options.input ?? '');
  });
}

/** OpenSSH's ssh with a configuration file, batch mode (never prompts). */
const ssh = (config: string, args: string[], options: { input?: string; timeoutMs?: number } = {}) => run('ssh', ['-F', config, '-o', 'BatchMode=yes', ...args], options);

const gwsh = (who: keyof typeof profiles, args: string[], input?: string) => runCli('gwsh', args, { env: profiles[who].env, ...(input === undefined ? {} : { input }) });
const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });


/** Signs a user in (root namespace, straight to the Proxy's address) and writes `gwsh config` to a file. */
async function signIn(who: keyof typeof profiles, user: string, extra: string[] = []): Promise<void> {
  const env = { HOME: dir, GWSH_HOME: join(dir, `gwsh-${who}`) };
  profiles[who] = { env, config: join(dir, `ssh_config-${who}`) };
  const login = await gwsh(who, ['login', `--proxy=${webAddr}`, `--user=${user}`, `--ca-pin=${pin}`, ...extra], `${PASSWORD}\n`);
  expect(login.stderr).toBe('');
  expect(login.status).toBe(0);
  const config = await gwsh(who, ['config']);
  expect(config.status).toBe(0);
  await writeFile(profiles[who].config, config.stdout);
}

/** A copy of a `gwsh config` file with some of its settings replaced (or removed, with null). */
async function variantConfig(from: string, name: string, settings: Record<string, string | null>): Promise<string> {
  const lines = (await readFile(from, 'utf8')).split('\n');
  const out = lines
    .map((line) => {
      const key = /^\s+(\w+)\s/.exec(line)?.[1];
      if (!key || !(key in settings)) return line;
      const value = settings[key];
      return value === null ? undefined : `    ${key} ${value}`;
    })
    .filter((l): l is string => l !== undefined);
  const file = join(dir, name);
  await writeFile(file, out.join('\n'));
  return file;
}

interface AuditEvent {
  event: string;
  user: string;
  login: string;
  node: string;
  session: string;
  kind: string;
  command?: string;
  exit_code?: number;
  signal?: string;
}

async function sessionEvents(): Promise<AuditEvent[]> {
  const r = await gwctl(['get', 'events', '--format', 'json']);
  expect(r.status).toBe(0);
  return (JSON.parse(r.stdout) as Array<{ spec: AuditEvent }>).map((e) => e.spec).filter((e) => e.event?.startsWith('session.'));
}

const tmux = (args: string[]) => run('tmux', ['-S', tmuxSocket!, ...args], { env: { TERM: 'xterm-256color' }, timeoutMs: 15_000 });
const pane = async () => (await tmux(['capture-pane', '-p', '-J', '-S', '-200', '-t', 'gw'])).stdout;

function sha256File(file: string): Promise<string> {
  return run('sha256sum', [file], { timeoutMs: 60_000 }).then((r) => r.stdout.split(' ')[0]!);
}

/** The OS user's uid. */
function osUid(): number {
  return Number(spawnSync('id', ['-u', OS_USER], { encoding: 'utf8' }).stdout.trim());
}

/** The command lines of alice's processes that are an sftp server (of any kind). */
async function sftpServerProcesses(): Promise<string[]> {
  const r = await run('ps', ['-u', OS_USER, '-o', 'args=']);
  const found = r.stdout.split('\n').filter((l) => l.includes('sftp-server'));
  if (found.length === 0) throw new Error(`no sftp server among alice's processes:\n${r.stdout}`);
  return found;
}

/** Runs fn while an sftp session of alice's is open (sftp reading commands from a pipe that stays open). */
async function withSftpSession<T>(fn: () => Promise<T>): Promise<T> {
  const child = spawn('sftp', ['-F', profiles.alice.config, '-o', 'BatchMode=yes', 'alice@web-1'], { env: { PATH: process.env.PATH ?? '', HOME: dir }, stdio: ['pipe', 'ignore', 'pipe'] });
  const closed = new Promise<unknown>((resolve) => child.once('close', resolve));
  try {
    return await fn();
  } finally {
    child.stdin.end();
    await closed;
  }
}

/** Stops the agent, gives it this configuration, starts it again and waits until ssh reaches web-1 through it. */
async function restartAgent(config: string): Promise<void> {
  expect(await agent.stop()).toBe(0);
  await writeFile(agent.configPath, config);
  const since = agent.logs().length;
  await agent.restart();
  await agent.waitForLog('reverse tunnel ready', 20_000, since);
  await eventually('ssh reaches web-1 again', async () => {
    const r = await ssh(profiles.alice.config, ['alice@web-1', 'echo back'], { timeoutMs: 30_000 });
    if (r.stdout !== 'back\n') throw new Error(r.stderr);
  });
}

/** Run by `sh -c` with $0 an empty directory: hides /usr/lib/openssh (if the host has it), then runs the rest. */
const HIDE_OPENSSH = 'if [ -d /usr/lib/openssh ]; then mount --bind "$0" /usr/lib/openssh || exit 1; fi; exec "$@"';

const agentConfig = [
  'gateway:',
  '  nodename: web-1',
  '  data_dir: DATA_DIR',
  '  log: { format: json }',
  'ssh_service:',
  '  enabled: yes',
  '  labels: { env: dev, team: web }',
  '',
].join('\n');

beforeAll(async () => {
  // The OS login the node gives alice: a real shell and a home directory.
  const existing = spawnSync('getent', ['passwd', OS_USER], { encoding: 'utf8' });
  if (existing.status === 0 && !existing.stdout.includes(OS_USER_COMMENT)) throw new Error(`an OS user ${OS_USER} exists already and is not this test's: not touching it`);
  if (existing.status !== 0) {
    const add = spawnSync('useradd', ['--create-home', '--shell', '/bin/bash', '--comment', OS_USER_COMMENT, OS_USER], { encoding: 'utf8' });
    if (add.status !== 0) throw new Error(`useradd ${OS_USER}: ${add.stderr}`);
  }
  createdOsUser = true;

  fw = await createFirewall();
  dir = await mkdtemp(join(tmpdir(), 'gwfw-ssh-e2e-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${fw.proxyIp} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({
    host: fw.agentGatewayIp,
    extraConfig: [`hosts_file ${join(dir, 'hosts')}`, `acl agent_net src ${fw.agentIp}/32`, 'http_access allow agent_net'],
  });
  webAddr = `${fw.proxyIp}:${WEB_PORT}`;
  proxy = await startGatewayIn(
    fw,
    fw.proxyNs,
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: ssh.example',
      `  listen_addr: ${fw.proxyIp}:3025`,
      '  keep_alive_interval: 1s',
      '  keep_alive_count_max: 3',
      'proxy_service:',
      `  web_listen_addr: ${fw.proxyIp}:${WEB_PORT}`,
      `  public_addr: ${PROXY_NAME}:${WEB_PORT}`,
      '',
    ].join('\n'),
    { name: 'ssh-proxy' },
  );
  const status = await gwctl(['status']);
  expect(status.stderr).toBe('');
  pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;

  // alice: the preset role access, with her logins as traits. carol: a role for prod nodes only.
  expect((await gwctl(['users', 'add', 'alice', '--roles=access', `--logins=${OS_USER},root`], `${PASSWORD}\n`)).status).toBe(0);
  await writeFile(
    join(dir, 'prod-role.yaml'),
    ['kind: role', 'version: v7', 'metadata: {name: prod-nodes}', 'spec:', '  allow:', `    logins: [${OS_USER}]`, '    node_labels: {env: prod}', ''].join('\n'),
  );
  expect((await gwctl(['create', join(dir, 'prod-role.yaml')])).status).toBe(0);
  expect((await gwctl(['users', 'add', 'carol', '--roles=prod-nodes'], `${PASSWORD}\n`)).status).toBe(0);
  const tokenOut = await gwctl(['tokens', 'add', '--type=node', '--ttl=10m', '--format', 'json']);
  expect(tokenOut.status).toBe(0);
  const token = (JSON.parse(tokenOut.stdout) as { token: string }).token;

  // web-1 joins through squid (its only way out) and opens its reverse tunnel through it. It sees an empty
  // /usr/lib/openssh (a bind mount in a mount namespace of its own), as on a node without OpenSSH's server.
  await mkdir(join(dir, 'empty'));
  // The built-in sftp server runs the agent's own program as the login user: run the agent from a copy of the
  // build that every user can read, as an installed gateway is (the checkout may be under /root, mode 0700).
  agent = await startGatewayIn(fw, fw.agentNs, agentConfig, {
    name: 'ssh-agent',
    program: gatewayForAnyUser(),
    args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${WEB_PORT}`],
    env: { HTTPS_PROXY: squid.url },
    wrap: ['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', HIDE_OPENSSH, join(dir, 'empty')],
  });
  await agent.waitForLog('reverse tunnel ready', 20_000);

  await signIn('alice', 'alice');
  await signIn('carol', 'carol');
  // A 3-second certificate, for the expiry tests further down (it has long expired by then).
  await signIn('short', 'alice', ['--ttl=3s']);

  tmuxSocket = join(dir, 'tmux.sock');
  await writeFile(join(dir, 'tmux.conf'), 'set -g remain-on-exit on\nset -g history-limit 5000\n');
}, 90_000);

afterAll(async () => {
  const steps: Array<() => Promise<unknown> | unknown> = [
    () => tmuxSocket && existsSync(tmuxSocket) && run('tmux', ['-S', tmuxSocket, 'kill-server'], { timeoutMs: 10_000 }),
    () => agent?.stop(true),
    () => proxy?.stop(true),
    () => squid?.stop(),
    () => fw?.close(),
    () => {
      if (!createdOsUser) return;
      // The user's processes ran inside the agent's namespace, whose processes fw.close() killed.
      const del = spawnSync('userdel', ['--remove', OS_USER], { encoding: 'utf8' });
      if (del.status !== 0 && del.status !== 12) throw new Error(`userdel ${OS_USER}: ${del.stderr}`);
    },
    () => dir && rm(dir, { recursive: true, force: true }),
  ];
  await runCleanup(steps);
}, 60_000);

describeAsRoot('the path: squid, one port, a node', () => {
  it('the agent cannot reach the Proxy except through squid, whose log shows its CONNECT to port 443', async () => {
    expect(await fw.tcpConnectFrom(fw.agentNs, fw.proxyIp, WEB_PORT, 3000)).toMatchObject({ ok: false });
    const line = await squid.waitForAccessLog((l) => {
      const e = parseAccessLogLine(l);
      return e.client === fw.agentIp && e.method === 'CONNECT' && e.url === `${PROXY_NAME}:${WEB_PORT}` && e.status === 200;
    });
    expect(line).toContain('TCP_TUNNEL');
    expect(agent.logs()).toContain('"joined the cluster"');
  });

  it('the Proxy routes every protocol on its one web port (TLS routing)', () => {
    const line = proxy.logs().split('\n').find((l) => l.includes('"proxy listening'))!;
    expect(JSON.parse(line)).toMatchObject({ addr: webAddr, tls_routing: true });
    expect(Object.keys(proxy.addresses).sort()).toEqual(['auth', 'web']);
  });

  it('gwsh ls lists web-1 with its labels', async () => {
    const r = await gwsh('alice', ['ls', '-f', 'json']);
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual([expect.objectContaining({ name: 'web-1', labels: { env: 'dev', team: 'web' }, agent: 'web-1' })]);
    expect((await gwsh('alice', ['ls'])).stdout).toMatch(/web-1\s+env=dev,team=web\s+web-1/);
  });

  it('gwsh config names gwsh as ProxyCommand and KnownHostsCommand, and the profile key and certificate', async () => {
    const config = await readFile(profiles.alice.config, 'utf8');
    const home = profiles.alice.env.GWSH_HOME!;
    expect(config).toContain(`Host * !${fw.proxyIp}`);
    expect(config).toMatch(/ProxyCommand .*gwsh\.js" proxy ssh %r@%h:%p/);
    expect(config).toMatch(/KnownHostsCommand .*gwsh\.js" known-hosts %H/);
    expect(config).toContain(`IdentityFile ${join(home, 'ssh-key')}`);
    expect(config).toContain(`CertificateFile ${join(home, 'ssh-key-cert.pub')}`);
  });
});

describeAsRoot('commands', () => {
  it("ssh -F <gwsh config> alice@web-1 'echo ok' prints ok", async () => {
    const r = await ssh(profiles.alice.config, ['alice@web-1', 'echo ok']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('ok\n');
    expect(r.status).toBe(0);
    // It went through the Proxy to the agent end to end (gwsh's default): the agent took the stream's grant.
    await agent.waitForLog('end-to-end stream opened');
    await agent.waitForLog('"SSH login"');
  });

  it("a command's standard output, standard error, exit code, standard input and environment", async () => {
    const r = await ssh(profiles.alice.config, ['alice@web-1', 'echo out; echo err >&2; id -un; pwd; echo "cluster=$GATEWAY_CLUSTER"; exit 3']);
    expect(r.stdout).toBe(`out\n${OS_USER}\n/home/${OS_USER}\ncluster=ssh.example\n`);
    expect(r.stderr).toBe('err\n');
    expect(r.status).toBe(3);
    const stdin = await ssh(profiles.alice.config, ['alice@web-1', 'tr a-z A-Z; echo done'], { input: 'through the gateway\n' });
    expect(stdin.stdout).toBe('THROUGH THE GATEWAY\ndone\n');
    const killed = await ssh(profiles.alice.config, ['alice@web-1', 'kill -TERM $$']);
    // As with sshd: the exit-signal message makes OpenSSH's ssh exit with 255, silently.
    expect(killed.status).toBe(255);
    expect(killed.stdout).toBe('');
  });

  it('another login the roles allow (root) works; gwsh ssh wraps ssh with the same configuration', async () => {
    const root = await ssh(profiles.alice.config, ['root@web-1', 'id -un']);
    expect(root.stdout).toBe('root\n');
    const wrapped = await gwsh('alice', ['ssh', 'alice@web-1', 'echo', 'wrapped']);
    expect(wrapped.stdout).toBe('wrapped\n');
    expect(wrapped.status).toBe(0);
  });

  it("gwsh known-hosts prints the host CA and web-1's key; a host key that does not match is refused", async () => {
    const r = await gwsh('alice', ['known-hosts', 'web-1']);
    expect(r.status).toBe(0);
    const [caLine, keyLine] = r.stdout.trim().split('\n');
    const ca = readFileSync(join(profiles.alice.env.GWSH_HOME!, 'ssh-host-ca.pub'), 'utf8').trim();
    expect(caLine).toBe(`@cert-authority * ${ca}`);
    expect(keyLine).toMatch(/^web-1 (ecdsa-sha2-nistp256|ssh-ed25519|ssh-rsa) [A-Za-z0-9+/=]+$/);
    // Another key for web-1: ssh must refuse the node's.
    spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'wrong-host-key')]);
    const wrong = readFileSync(join(dir, 'wrong-host-key.pub'), 'utf8').trim().split(' ').slice(0, 2).join(' ');
    await writeFile(join(dir, 'wrong-known-hosts.sh'), `#!/bin/sh\necho "web-1 ${wrong}"\n`, { mode: 0o755 });
    const config = await variantConfig(profiles.alice.config, 'ssh_config-wrong-host', { KnownHostsCommand: join(dir, 'wrong-known-hosts.sh') });
    const refused = await ssh(config, ['alice@web-1', 'echo should-not-run']);
    expect(refused.status).toBe(255);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toMatch(/Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED/);
  });
});

describeAsRoot('files: 256 MiB both ways', () => {
  it('the node has no OpenSSH sftp-server: /usr/lib/openssh is empty for the agent and its sessions', async () => {
    const r = await ssh(profiles.alice.config, ['alice@web-1', 'ls -A /usr/lib/openssh; echo end']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('end\n');
  });

  it('scp up and down (SFTP protocol) and scp -O down (the scp protocol): byte-exact, sha256 at both ends, owned by the login', async () => {
    const local = join(dir, 'big.bin');
    const back = join(dir, 'big.back');
    expect((await run('sh', ['-c', `head -c ${BIG} /dev/urandom > ${local}`])).status).toBe(0);
    const sum = await sha256File(local);

    const up = await run('scp', ['-F', profiles.alice.config, '-o', 'BatchMode=yes', '-q', local, 'alice@web-1:big.bin'], { timeoutMs: 120_000 });
    expect(up.stderr).toBe('');
    expect(up.status).toBe(0);
    const remote = await ssh(profiles.alice.config, ['alice@web-1', 'stat -c "%s %U" big.bin && sha256sum big.bin']);
    expect(remote.stdout).toBe(`${BIG} ${OS_USER}\n${sum}  big.bin\n`);
    // Written by the sftp server running as alice, not by the agent (root).
    expect((await stat(`/home/${OS_USER}/big.bin`)).uid).toBe(osUid());

    const down = await run('scp', ['-F', profiles.alice.config, '-o', 'BatchMode=yes', '-q', 'alice@web-1:big.bin', back], { timeoutMs: 120_000 });
    expect(down.stderr).toBe('');
    expect(down.status).toBe(0);
    expect(await sha256File(back)).toBe(sum);
    await rm(back);

    const legacy = await run('scp', ['-O', '-F', profiles.alice.config, '-o', 'BatchMode=yes', '-q', 'alice@web-1:big.bin', back], { timeoutMs: 120_000 });
    expect(legacy.stderr).toBe('');
    expect(legacy.status).toBe(0);
    expect(await sha256File(back)).toBe(sum);
    await rm(back);
  }, 360_000);

  it('sftp: a batch that lists, uploads, downloads, makes a directory, renames, links and removes', async () => {
    await writeFile(join(dir, 'small.txt'), 'small file\n'.repeat(1000));
    await writeFile(
      join(dir, 'batch'),
      [
        `put ${join(dir, 'small.txt')} small.txt`,
        'ls -1',
        `get small.txt ${join(dir, 'small.back')}`,
        'mkdir sub',
        'rename small.txt sub/moved.txt',
        'ln -s sub/moved.txt link',
        'ls -1 sub',
        '',
      ].join('\n'),
    );
    const r = await run('sftp', ['-F', profiles.alice.config, '-o', 'BatchMode=yes', '-b', join(dir, 'batch'), 'alice@web-1']);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('sftp> ls -1\nbig.bin\nsmall.txt\n');
    expect(r.stdout).toContain('sftp> ls -1 sub\nsub/moved.txt\n');
    expect(await readFile(join(dir, 'small.back'), 'utf8')).toBe('small file\n'.repeat(1000));
    const home = `/home/${OS_USER}`;
    expect((await stat(`${home}/sub`)).uid).toBe(osUid());
    expect((await stat(`${home}/sub/moved.txt`)).uid).toBe(osUid());
    expect(readFileSync(`${home}/link`, 'utf8')).toBe('small file\n'.repeat(1000));

    await writeFile(join(dir, 'batch-rm'), ['rm link', 'rm sub/moved.txt', 'rmdir sub', 'rm big.bin', 'ls -1', ''].join('\n'));
    const rm2 = await run('sftp', ['-F', profiles.alice.config, '-o', 'BatchMode=yes', '-b', join(dir, 'batch-rm'), 'alice@web-1']);
    expect(rm2.stderr).toBe('');
    expect(rm2.status).toBe(0);
    for (const name of ['link', 'sub', 'big.bin']) expect(existsSync(`${home}/${name}`)).toBe(false);
  });

  it("the sftp server is the agent's built-in one, run as the login user, with only that user's rights", async () => {
    const servers = await withSftpSession(() => eventually('an sftp server process of alice', sftpServerProcesses));
    expect(servers).toEqual([`${process.execPath} ${gatewayForAnyUser()} sftp-server`]);

    // /root is 0700: root could, alice cannot.
    await writeFile(join(dir, 'batch-denied'), ['-ls /root', `-put ${join(dir, 'small.txt')} /etc/gw-planted`, 'pwd', ''].join('\n'));
    const r = await run('sftp', ['-F', profiles.alice.config, '-o', 'BatchMode=yes', '-b', join(dir, 'batch-denied'), 'alice@web-1']);
    expect(r.status).toBe(0);
    expect(r.stdout).toContain(`Remote working directory: /home/${OS_USER}\n`);
    expect(r.stderr.match(/Permission denied/g)).toHaveLength(2);
    expect(existsSync('/etc/gw-planted')).toBe(false);
  });

  it.skipIf(!existsSync(SYSTEM_SFTP_SERVER))(
    `ssh_service.sftp_server: the system's sftp-server when configured (needs ${SYSTEM_SFTP_SERVER}, Debian package openssh-sftp-server)`,
    async () => {
      // The agent cannot see /usr/lib/openssh: it runs a copy of OpenSSH's program, from a path of its own.
      const program = join(dir, 'system-sftp-server');
      await copyFile(SYSTEM_SFTP_SERVER, program);
      await chmod(program, 0o755);
      const original = await readFile(agent.configPath, 'utf8');
      await restartAgent(original.replace('ssh_service:\n', `ssh_service:\n  sftp_server: ${program}\n`));
      try {
        const servers = await withSftpSession(() => eventually('an sftp server process of alice', sftpServerProcesses));
        expect(servers).toEqual([program]);
        await writeFile(join(dir, 'batch-system'), [`put ${join(dir, 'small.txt')} by-system.txt`, 'rm by-system.txt', ''].join('\n'));
        const r = await run('sftp', ['-F', profiles.alice.config, '-o', 'BatchMode=yes', '-b', join(dir, 'batch-system'), 'alice@web-1']);
        expect(r.stderr).toBe('');
        expect(r.status).toBe(0);
      } finally {
        await restartAgent(original);
      }
    },
    120_000,
  );
});

describeAsRoot('an interactive session in a terminal (tmux)', () => {
  it('a pty of the terminal size follows a window size change, and the exit status comes back', async () => {
    // ssh's exit status is printed by a shell around it: tmux sometimes marks a pane dead before it has reaped
    // the process, and then never shows its status (seen with tmux 3.3a), so #{pane_dead_status} cannot be relied on.
    const command = `sh -c 'ssh -F ${profiles.alice.config} -tt alice@web-1; echo "ssh-exit=$?"'`;
    const started = await tmux(['-f', join(dir, 'tmux.conf'), 'new-session', '-d', '-s', 'gw', '-x', '100', '-y', '30', command]);
    expect(started.stderr).toBe('');
    // Typed ahead or not, the shell reads it: wait for its answer, never for a fixed time.
    await tmux(['send-keys', '-t', 'gw', 'echo "ready:$((6 * 7))"', 'Enter']);
    await eventually('the remote shell answers', async () => {
      const text = await pane();
      if (!text.includes('ready:42')) throw new Error(text);
    });
    await tmux(['send-keys', '-t', 'gw', 'tty; echo "term=$TERM"; stty size', 'Enter']);
    const first = await eventually('stty size shows 30 rows, 100 columns', async () => {
      const text = await pane();
      if (!/^30 100\s*$/m.test(text)) throw new Error(text);
      return text;
    });
    expect(first).toMatch(/^\/dev\/pts\/\d+\s*$/m);
    expect(first).toMatch(/^term=(screen|tmux)/m);

    await tmux(['resize-window', '-t', 'gw', '-x', '120', '-y', '40']);
    // The change reaches the node asynchronously (SIGWINCH to ssh, window-change, the pty): ask until it shows.
    await eventually(
      'stty size shows 40 rows, 120 columns after the resize',
      async () => {
        await tmux(['send-keys', '-t', 'gw', 'stty size', 'Enter']);
        await sleep(300);
        const text = await pane();
        if (!/^40 120\s*$/m.test(text)) throw new Error(text);
      },
      30_000,
      0,
    );

    await tmux(['send-keys', '-t', 'gw', 'exit 7', 'Enter']);
    const status = await eventually('ssh exits', async () => {
      const text = await pane();
      const m = /^ssh-exit=(\d+)\s*$/m.exec(text);
      if (!m) throw new Error(text);
      return m[1];
    });
    expect(status).toBe('7');
    await tmux(['kill-session', '-t', 'gw']);
  });

  it('every session is an audit event: user, login, node, kind, exit code', async () => {
    const events = await eventually('the session events are recorded', async () => {
      const all = await sessionEvents();
      if (!all.some((e) => e.event === 'session.end' && e.kind === 'shell')) throw new Error(JSON.stringify(all.slice(-4)));
      return all;
    });
    const ends = events.filter((e) => e.event === 'session.end');
    expect(ends).toContainEqual(expect.objectContaining({ user: 'alice', login: OS_USER, node: 'web-1', kind: 'exec', command: 'echo ok', exit_code: 0 }));
    expect(ends).toContainEqual(expect.objectContaining({ user: 'alice', login: OS_USER, node: 'web-1', kind: 'exec', exit_code: 3 }));
    expect(ends).toContainEqual(expect.objectContaining({ user: 'alice', login: OS_USER, node: 'web-1', kind: 'exec', command: 'kill -TERM $$', signal: 'SIGTERM' }));
    expect(ends).toContainEqual(expect.objectContaining({ user: 'alice', login: 'root', node: 'web-1', kind: 'exec', command: 'id -un', exit_code: 0 }));
    expect(ends).toContainEqual(expect.objectContaining({ user: 'alice', login: OS_USER, node: 'web-1', kind: 'subsystem', command: 'sftp' }));
    expect(ends).toContainEqual(expect.objectContaining({ user: 'alice', login: OS_USER, node: 'web-1', kind: 'shell', exit_code: 7 }));
    // Every session that ended had started.
    const started = new Set(events.filter((e) => e.event === 'session.start').map((e) => e.session));
    for (const end of ends) expect(started.has(end.session)).toBe(true);
  });
});

describeAsRoot('a client that goes away', () => {
  /** The command lines of the OS user's processes (all of them run on the node: the agent started them). */
  async function userProcesses(): Promise<string[]> {
    const r = await run('ps', ['-u', OS_USER, '-o', 'args=']);
    return r.stdout.split('\n').filter(Boolean);
  }

  it('its commands do not outlive it: a terminal is hung up (SIGHUP), pipes are closed (SIGPIPE), as with sshd', async () => {
    const clients = [
      spawn('ssh', ['-F', profiles.alice.config, '-tt', 'alice@web-1', 'echo started; sleep 4242'], { env: { PATH: process.env.PATH ?? '', HOME: dir }, stdio: ['pipe', 'pipe', 'pipe'] }),
      spawn('ssh', ['-F', profiles.alice.config, 'alice@web-1', 'echo started; while :; do echo tick; sleep 0.1; done'], { env: { PATH: process.env.PATH ?? '', HOME: dir }, stdio: ['pipe', 'pipe', 'pipe'] }),
    ];
    try {
      await Promise.all(
        clients.map(
          (c) =>
            new Promise<void>((resolve, reject) => {
              let out = '';
              const timer = setTimeout(() => reject(new Error(`the session did not start: ${out}`)), 30_000);
              c.stdout!.on('data', (d: Buffer) => {
                out += d.toString();
                if (out.includes('started')) {
                  clearTimeout(timer);
                  resolve();
                }
              });
            }),
        ),
      );
      expect((await userProcesses()).some((p) => p.includes('sleep 4242'))).toBe(true);
    } finally {
      // The client dies without a word to the node (no channel close, no disconnect message).
      for (const c of clients) c.kill('SIGKILL');
    }
    await eventually('the commands are gone from the node', async () => {
      const left = (await userProcesses()).filter((p) => p.includes('sleep 4242') || p.includes('echo tick'));
      if (left.length > 0) throw new Error(left.join('\n'));
    });
    const ends = await eventually('both sessions ended in the audit log', async () => {
      const found = (await sessionEvents()).filter((e) => e.event === 'session.end' && (e.command?.includes('sleep 4242') || e.command?.includes('echo tick')));
      if (found.length < 2) throw new Error(JSON.stringify(found));
      return found;
    });
    expect(ends).toContainEqual(expect.objectContaining({ command: 'echo started; sleep 4242', signal: 'SIGHUP' }));
    expect(ends).toContainEqual(expect.objectContaining({ command: expect.stringContaining('echo tick'), signal: 'SIGPIPE' }));
  });
});

describeAsRoot('refusals', () => {
  it('a login not among the user’s logins: GW_ERR_ACCESS_DENIED from gwsh, ssh exits 255', async () => {
    const r = await ssh(profiles.alice.config, ['bob@web-1', 'echo should-not-run']);
    expect(r.status).toBe(255);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('code: GW_ERR_ACCESS_DENIED');
    expect(r.stderr).toContain('login "bob" is not allowed for alice (allowed: alice, root)');
  });

  it("a role whose node_labels do not match the node's labels", async () => {
    expect(JSON.parse((await gwsh('carol', ['ls', '-f', 'json'])).stdout)).toEqual([]);
    const r = await ssh(profiles.carol.config, ['alice@web-1', 'echo should-not-run']);
    expect(r.status).toBe(255);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('code: GW_ERR_ACCESS_DENIED');
    expect(r.stderr).toContain('prod-nodes');
    expect(r.stderr).toContain('"env":"dev"');
  });

  it('an expired certificate: the ProxyCommand says so, with its own code and the login that renews it', async () => {
    const validUntil = Date.parse((JSON.parse((await gwsh('short', ['status', '-f', 'json'])).stdout) as { active: { valid_until: string } }).active.valid_until);
    await sleep(Math.max(0, validUntil + 1000 - Date.now()));
    const r = await ssh(profiles.short.config, ['alice@web-1', 'echo should-not-run']);
    expect(r.status).toBe(255);
    expect(r.stdout).toBe('');
    // gwsh sees it before connecting (the Proxy refuses one presented anyway with the same code: test/cli/gwsh-errors.test.ts).
    expect(r.stderr).toContain('code: GW_ERR_CLIENT_CERT_EXPIRED');
    expect(r.stderr).toMatch(/^hint: Run 'gwsh login --proxy=\S+ --user=\S+' for a fresh one\.$/m);
  });

  it('an expired SSH certificate over a valid connection: the node refuses it and its log says why', async () => {
    // alice's valid profile carries the connection; ssh offers the expired certificate of the short profile.
    const home = profiles.short.env.GWSH_HOME!;
    const config = await variantConfig(profiles.alice.config, 'ssh_config-expired-cert', { IdentityFile: join(home, 'ssh-key'), CertificateFile: join(home, 'ssh-key-cert.pub') });
    const r = await ssh(config, ['alice@web-1', 'echo should-not-run']);
    expect(r.status).toBe(255);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('Permission denied (publickey)');
    expect(JSON.parse(await agent.waitForLog('certificate expired or not yet valid'))).toMatchObject({ msg: 'SSH login refused', user: 'alice', login: OS_USER });
  });

  it('a plain key without a certificate: Permission denied', async () => {
    const key = join(dir, 'plain-key');
    expect(spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', key]).status).toBe(0);
    const config = await variantConfig(profiles.alice.config, 'ssh_config-plain', { IdentityFile: key, CertificateFile: null });
    const r = await ssh(config, ['-o', 'IdentitiesOnly=yes', 'alice@web-1', 'echo should-not-run']);
    expect(r.status).toBe(255);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('Permission denied (publickey)');
    await agent.waitForLog('refused a plain key');
  });
});

describeAsRoot('a node that went offline', () => {
  it('its link cut: a clear GW_ERR_TUNNEL_NOT_FOUND once the Proxy notices, never a hang; back when the link is', async () => {
    fw.setAgentLink(false);
    try {
      await eventually(
        'ssh says the node is not connected',
        async () => {
          const r = await ssh(profiles.alice.config, ['alice@web-1', 'echo should-not-run'], { timeoutMs: 45_000 });
          expect(r.status).toBe(255);
          if (!r.stderr.includes('code: GW_ERR_TUNNEL_NOT_FOUND')) throw new Error(r.stderr);
        },
        60_000,
      );
    } finally {
      fw.setAgentLink(true);
    }
    await eventually('ssh works again once the agent is back', async () => {
      const r = await ssh(profiles.alice.config, ['alice@web-1', 'echo back'], { timeoutMs: 45_000 });
      if (r.stdout !== 'back\n') throw new Error(r.stderr);
    }, 60_000);
  }, 150_000);

  it('its agent stopped: gwsh ls no longer lists it and ssh fails at once with GW_ERR_TUNNEL_NOT_FOUND', async () => {
    expect(await agent.stop()).toBe(0);
    await eventually('gwsh ls is empty', async () => {
      const r = await gwsh('alice', ['ls', '-f', 'json']);
      expect(JSON.parse(r.stdout)).toEqual([]);
    });
    const r = await ssh(profiles.alice.config, ['alice@web-1', 'echo should-not-run'], { timeoutMs: 30_000 });
    expect(r.status).toBe(255);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('code: GW_ERR_TUNNEL_NOT_FOUND');
    expect(r.stderr).toContain('web-1');
  });
});
