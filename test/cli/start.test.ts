/** `gateway start` and `gateway configure` as an operator runs them. */
import { spawn, spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as nodePty from 'node-pty';
import { publicCopyOfBuild, UNPRIVILEGED_USER } from '../helpers/asuser.js';
import { waitUntil } from '../helpers/wait.js';
import { processAlive } from '../../src/proc.js';

const GATEWAY = fileURLToPath(new URL('../../dist/cli/gateway.js', import.meta.url));
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-start-'));
  // The configuration the lock tests start with (each gives its own --data-dir, but for the first).
  await writeFile(join(dir, 'lock.yaml'), `gateway:\n  data_dir: ${join(dir, 'shared')}\nauth_service:\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n`);
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('gateway start', () => {
  it('loads a configuration, prepares the data directory, and stops cleanly on SIGTERM', async () => {
    const dataDir = join(dir, 'data');
    const file = join(dir, 'gateway.yaml');
    await writeFile(file, `gateway:\n  nodename: node-1\n  data_dir: ${dataDir}\n  log:\n    format: json\nauth_service:\n  cluster_name: test\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  enabled: "yes"\n  web_listen_addr: 127.0.0.1:0\n`);
    const child = spawn(process.execPath, [GATEWAY, 'start', '-c', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    await new Promise<void>((resolve, reject) => {
      child.stderr.on('data', (c: Buffer) => {
        stderr += c.toString();
        if (stderr.includes('gateway started')) resolve();
      });
      child.once('exit', (code) => reject(new Error(`exited early with ${code}: ${stderr}`)));
    });
    const line = JSON.parse(stderr.split('\n').find((l) => l.includes('gateway started'))!) as { services: string[]; nodename: string };
    expect(line.services).toEqual(['auth_service', 'proxy_service']);
    expect(line.nodename).toBe('node-1');
    expect((await stat(dataDir)).mode & 0o777).toBe(0o700);
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });

  it('a wrong configuration stops start-up with the key path, line and column, a hint and status 1', async () => {
    const file = join(dir, 'bad.yaml');
    await writeFile(file, `proxy_service:\n  enabled: yes\n  web_listn_addr: 0.0.0.0:443\n`);
    const r = spawnSync(process.execPath, [GATEWAY, 'start', '-c', file], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('bad.yaml:3:3');
    expect(r.stderr).toContain('proxy_service.web_listn_addr');
    expect(r.stderr).toMatch(/^hint: .*web_listen_addr/m);
    expect(r.stderr).toContain('GW_ERR_CONFIG_UNKNOWN_KEY');
    expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace without --debug
  });

  it('a missing file is a read error naming the path', () => {
    const r = spawnSync(process.execPath, [GATEWAY, 'start', '-c', join(dir, 'nope.yaml')], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_CONFIG_READ');
    expect(r.stderr).toContain('nope.yaml');
  });

  it('a configuration that enables nothing is refused', async () => {
    const file = join(dir, 'none.yaml');
    await writeFile(file, `gateway:\n  data_dir: ${join(dir, 'd2')}\nproxy_service:\n  enabled: no\n`);
    const r = spawnSync(process.execPath, [GATEWAY, 'start', '-c', file], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_CONFIG_VALUE');
  });
});

/** Starts `gateway start ARGS` and resolves with its output once the banner's CA pin line is out. */
function startAndWait(args: string[], options: { uid?: number; gid?: number; env?: NodeJS.ProcessEnv; node?: string } = {}) {
  const child = spawn(process.execPath, [options.node ?? GATEWAY, 'start', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(options.uid !== undefined ? { uid: options.uid, gid: options.gid! } : {}),
    ...(options.env ? { env: options.env } : {}),
  });
  let stdout = '';
  let stderr = '';
  const ready = new Promise<{ stdout: string; stderr: string }>((resolve, reject) => {
    child.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
      if (/CA pin\s+sha256:[0-9a-f]{64}\n/.test(stdout)) resolve({ stdout, stderr });
    });
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.once('exit', (code) => reject(new Error(`exited early with ${code}: ${stdout}${stderr}`)));
  });
  const stop = async (): Promise<number | null> => {
    if (child.exitCode !== null) return child.exitCode;
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    return exited;
  };
  return { child, ready, stop };
}

describe('one daemon per data directory', () => {
  it('a second gateway on a data directory in use is refused, naming the directory, the pid and the fix', async () => {
    const dataDir = join(dir, 'shared');
    const file = join(dir, 'lock.yaml');
    const first = startAndWait(['-c', file]);
    try {
      await first.ready;
      // An agent from a configuration without data_dir would land here too, as root: the same refusal.
      const second = spawnSync(process.execPath, [GATEWAY, 'start', '-c', file], { encoding: 'utf8', timeout: 20_000 });
      expect(second.status).toBe(1);
      expect(second.stderr).toContain('GW_ERR_DATA_DIR_IN_USE');
      expect(second.stderr).toContain(dataDir);
      expect(second.stderr).toContain(`pid ${first.child.pid}`);
      expect(second.stderr).toMatch(/^hint: .*--data-dir/m);
      // The running one lost nothing: its lock and its identity files are still there.
      // It records its pid and when that process started (a pid reused by another program is not the holder).
      expect(readFileSync(join(dataDir, 'gateway.lock'), 'utf8')).toMatch(new RegExp(`^${first.child.pid}\nstarted \\d+@[0-9a-f-]{36}\n$`));
      // --data-dir gives the second one a directory of its own.
      const own = startAndWait(['-c', file, '--data-dir', join(dir, 'own')]);
      const { stdout } = await own.ready;
      expect(stdout).toContain(`data directory${' '.repeat(30)} ${join(dir, 'own')}`);
      expect(await own.stop()).toBe(0);
    } finally {
      expect(await first.stop()).toBe(0);
    }
    expect(existsSync(join(dataDir, 'gateway.lock'))).toBe(false);
  });

  it('a lock left by a gateway that died is taken over', async () => {
    const dataDir = join(dir, 'stale');
    mkdirSync(dataDir, { recursive: true });
    const dead = spawnSync('true').pid!; // a pid that no longer runs
    writeFileSync(join(dataDir, 'gateway.lock'), `${dead}\n`);
    const g = startAndWait(['--data-dir', dataDir, '-c', join(dir, 'lock.yaml')]);
    await g.ready;
    expect(await g.stop()).toBe(0);
  });

  it('a lock left by a gateway killed with SIGKILL is taken over, with a log line naming its pid', async () => {
    const dataDir = join(dir, 'killed');
    const first = startAndWait(['--data-dir', dataDir, '-c', join(dir, 'lock.yaml')]);
    await first.ready;
    const died = new Promise((resolve) => first.child.once('exit', resolve));
    first.child.kill('SIGKILL'); // no clean-up runs: the lock stays
    await died;
    expect(readFileSync(join(dataDir, 'gateway.lock'), 'utf8').split('\n')[0]).toBe(String(first.child.pid));
    const second = startAndWait(['--data-dir', dataDir, '-c', join(dir, 'lock.yaml')]);
    const { stderr } = await second.ready;
    const line = stderr.split('\n').find((l) => l.includes('taking over a lock'));
    expect(JSON.parse(line!)).toMatchObject({ stale_pid: first.child.pid, path: join(dataDir, 'gateway.lock') });
    expect(await second.stop()).toBe(0);
  });

  it('a lock whose pid now belongs to another program (started after the lock was written) is taken over', async () => {
    const dataDir = join(dir, 'reused');
    mkdirSync(dataDir, { recursive: true });
    // A live process whose command line says "gateway", as a reused pid can: the cmdline check alone takes it for the holder.
    const impostor = spawn('sh', ['-c', 'sleep 60', 'gateway-impostor'], { stdio: 'ignore' });
    try {
      const bootId = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
      writeFileSync(join(dataDir, 'gateway.lock'), `${impostor.pid}\nstarted 1@${bootId}\n`);
      const g = startAndWait(['--data-dir', dataDir, '-c', join(dir, 'lock.yaml')]);
      const { stderr } = await g.ready;
      expect(stderr).toContain('taking over a lock whose gateway is no longer running');
      expect(await g.stop()).toBe(0);
    } finally {
      impostor.kill('SIGKILL');
    }
  });

  it('--public-addr written as a URL is told to drop the scheme; started with what the hint says, clients are sent there', async () => {
    const r = spawnSync(process.execPath, [GATEWAY, 'start', '--public-addr', 'https://gw.example.com', '--data-dir', join(dir, 'url')], { encoding: 'utf8' });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
    const instead = /^hint: Drop the scheme: write host:port, here (\S+)\.$/m.exec(r.stderr)?.[1];
    expect(instead).toBe('gw.example.com:443');
    const g = startAndWait(['-c', join(dir, 'lock.yaml'), '--data-dir', join(dir, 'url'), '--public-addr', instead!]);
    const { stdout } = await g.ready;
    expect(stdout).toContain('Clients and agents reach this Proxy at gw.example.com:443');
    expect(await g.stop()).toBe(0);
  });

  it('--data-dir must be an absolute path', () => {
    const r = spawnSync(process.execPath, [GATEWAY, 'start', '--data-dir', 'relative/dir'], { encoding: 'utf8' });
    expect(r.status).toBe(2); // a usage error
    expect(r.stderr).toContain('GW_ERR_USAGE');
    expect(r.stderr).toContain('not an absolute path');
  });
});

describe('a daemon that outlives its terminal', () => {
  /** The daemon's pid, from its data directory's lock once it has one. */
  const lockHolder = async (dataDir: string): Promise<number> => {
    const lock = join(dataDir, 'gateway.lock');
    await waitUntil('the daemon holds its lock', () => existsSync(lock) && readFileSync(lock, 'utf8').includes('started'));
    return Number(readFileSync(lock, 'utf8').split('\n')[0]);
  };
  /** Asks the daemon for a log line (a SIGHUP reload logs one), waits for it in its fallback log, then stops it. */
  const logsOnThenStops = async (pid: number, dataDir: string, lost: RegExp): Promise<void> => {
    const fallback = join(dataDir, 'gateway.log');
    process.kill(pid, 'SIGHUP');
    await waitUntil('the reload is logged in <data_dir>/gateway.log', () => existsSync(fallback) && readFileSync(fallback, 'utf8').includes('configuration reloaded'));
    const text = readFileSync(fallback, 'utf8');
    expect(text.split('\n')[0]).toMatch(lost);
    expect(text).toContain('the gateway keeps running');
    expect(statSync(fallback).mode & 0o777).toBe(0o600);
    expect(processAlive(pid)).toBe(true);
    process.kill(pid, 'SIGTERM');
    await waitUntil('the daemon stops', () => !processAlive(pid));
    // It stopped cleanly: its lock is gone, and a new start on the directory is not refused.
    expect(existsSync(join(dataDir, 'gateway.lock'))).toBe(false);
    const again = startAndWait(['--data-dir', dataDir, '-c', join(dir, 'lock.yaml')]);
    await again.ready;
    expect(await again.stop()).toBe(0);
  };

  it('`gateway start 2>&1 | head -3`: the closed pipe (EPIPE) does not stop it; its logs go on in <data_dir>/gateway.log', async () => {
    const dataDir = join(dir, 'epipe');
    const file = join(dir, 'epipe.yaml');
    await writeFile(file, `gateway:\n  data_dir: ${dataDir}\n  log:\n    format: json\nauth_service:\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n`);
    const shell = spawn('sh', ['-c', `"${process.execPath}" "${GATEWAY}" start -c "${file}" 2>&1 | head -3`], { stdio: ['ignore', 'pipe', 'inherit'] });
    let seen = '';
    shell.stdout.on('data', (c: Buffer) => (seen += c.toString()));
    const pid = await lockHolder(dataDir);
    await waitUntil('head has printed its 3 lines', () => seen.split('\n').length > 3);
    await logsOnThenStops(pid, dataDir, /standard error is gone \(EPIPE\): logging continues in this file/);
    expect(seen).not.toContain('EPIPE');
  });

  it('a terminal that goes away (EIO, and the SIGHUP it sends) does not stop it either', async () => {
    const dataDir = join(dir, 'eio');
    const file = join(dir, 'eio.yaml');
    await writeFile(file, `gateway:\n  data_dir: ${dataDir}\nauth_service:\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n`);
    const term = nodePty.spawn(process.execPath, [GATEWAY, 'start', '-c', file], { cols: 200, rows: 50, cwd: dir, env: process.env as Record<string, string> });
    let seen = '';
    term.onData((d) => (seen += d));
    try {
      await waitUntil('the banner on the terminal', () => /CA pin\s+sha256:/.test(seen));
      const pid = await lockHolder(dataDir);
      expect(pid).toBe(term.pid);
      (term as unknown as { destroy(): void }).destroy(); // node-pty's UnixTerminal (not in IPty's type); the terminal is closed: writes to it fail with EIO; node-pty then sends SIGHUP, as a closing terminal does
      await logsOnThenStops(pid, dataDir, /standard (error|output) is gone \(EIO\)/);
    } finally {
      if (processAlive(term.pid)) process.kill(term.pid, 'SIGKILL');
    }
  });
});

describe('gateway start as a normal user, with the embedded defaults', () => {
  // As root (CI) the normal user is "nobody"; as anyone else, that user.
  const { uid, gid } = UNPRIVILEGED_USER;
  let copy: string;
  let home: string;
  beforeAll(() => {
    // The checkout may be where nobody cannot enter (/root): run a copy of the build from a public directory.
    copy = publicCopyOfBuild();
    home = join(copy, 'home');
    mkdirSync(home, { mode: 0o700 });
    chownSync(home, uid, gid);
  });
  afterAll(() => rmSync(copy, { recursive: true, force: true }));

  it('keeps its data under ~/.local/state/gateway, listens on 3080 and 3025, prints them and the CA pin; gwctl finds it', async () => {
    for (const port of [3080, 3025]) {
      // These are the defaults under test; a test of defaults cannot pick other ports.
      const probe = net.createServer();
      await new Promise<void>((resolve, reject) => probe.once('error', () => reject(new Error(`port ${port} is in use on this machine`))).listen(port, '0.0.0.0', resolve));
      await new Promise((r) => probe.close(r));
    }
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home };
    const g = startAndWait([], { uid, gid, env, node: join(copy, 'dist/cli/gateway.js') });
    try {
      const { stdout } = await g.ready;
      const dataDir = join(home, '.local/state/gateway');
      expect(stdout.split('\n')[0]).toMatch(/^Gateway \S+ started: auth_service, proxy_service$/);
      expect(stdout).toMatch(/web, API and \(TLS routing\) every protocol\s+0\.0\.0\.0:3080\n/);
      expect(stdout).toMatch(/Auth API \(mutual TLS\)\s+0\.0\.0\.0:3025\n/);
      // The banner is one write: the lines after the CA pin are in the same chunk.
      expect(stdout).toMatch(/^Web UI: https:\/\/\S+:3080\/web\/ /m);
      expect(stdout).toContain(`data directory${' '.repeat(30)} ${dataDir}`);
      expect(statSync(dataDir).uid).toBe(uid);
      const pin = /CA pin\s+(sha256:[0-9a-f]{64})/.exec(stdout)![1];
      // gwctl, as the same user and with no flags, uses that data directory's admin identity.
      const status = spawnSync(process.execPath, [join(copy, 'dist/cli/gwctl.js'), 'status'], { uid, gid, env, encoding: 'utf8' });
      expect(status.stderr).toBe('');
      expect(status.stdout).toContain(pin);
    } finally {
      expect(await g.stop()).toBe(0);
    }
  });
});

describe('gateway configure', () => {
  it('prints a commented sample that gateway start accepts', async () => {
    const r = spawnSync(process.execPath, [GATEWAY, 'configure'], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^#/m);
    const file = join(dir, 'sample.yaml');
    // Point the data directory somewhere writable and listeners at free ports; everything else as printed.
    const text = r.stdout
      .replace(/^(\s*)(?:# )?data_dir: .*$/m, `$1data_dir: ${join(dir, 'sample-data')}`)
      .replace(/^(\s*)(listen_addr|web_listen_addr): .*$/gm, '$1$2: 127.0.0.1:0');
    await writeFile(file, text);
    const child = spawn(process.execPath, [GATEWAY, 'start', '-c', file], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    const outcome = await new Promise<string>((resolve) => {
      child.stderr.on('data', (c: Buffer) => {
        stderr += c.toString();
        if (stderr.includes('gateway started')) resolve('started');
      });
      child.once('exit', (code) => resolve(`exited ${code}: ${stderr}`));
    });
    child.kill('SIGTERM');
    expect(outcome).toBe('started');
    expect(existsSync(join(dir, 'sample-data', 'backend.sqlite'))).toBe(true);
  });
});
