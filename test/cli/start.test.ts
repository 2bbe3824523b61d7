/** `gateway start` and `gateway configure` as an operator runs them. */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const GATEWAY = fileURLToPath(new URL('../../dist/cli/gateway.js', import.meta.url));
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-start-'));
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

describe('gateway configure', () => {
  it('prints a commented sample that gateway start accepts', async () => {
    const r = spawnSync(process.execPath, [GATEWAY, 'configure'], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^#/m);
    const file = join(dir, 'sample.yaml');
    // Point the data directory somewhere writable and listeners at free ports; everything else as printed.
    const text = r.stdout
      .replace(/data_dir: .*/, `data_dir: ${join(dir, 'sample-data')}`)
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
  });
});
