/**
 * The Ansible collection of deploy/ansible/ (gateway.gateway) run by Debian's ansible-playbook against a real
 * daemon, as an operator runs it: the collection used in place (ANSIBLE_COLLECTIONS_PATH at the repository, no
 * Galaxy, no network), Ansible's temporary files in a directory of the test, the json callback for results.
 *
 * A playbook creates a role and the maintenance window (changed=2), the same playbook again changes nothing
 * (changed=0), one value changed reports changed=1 with the plan's diff in --diff mode, --check changes nothing,
 * state absent removes (and again reports no change), and a refused resource fails the task with gwctl's code.
 * Results are read from the default callback's output (ansible-core ships no json callback).
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';

const COLLECTIONS = fileURLToPath(new URL('../../deploy/ansible', import.meta.url));

let dir: string;
let gw: RunningGateway;

interface PlaybookRun {
  status: number | null;
  /** From the PLAY RECAP line of localhost. */
  changed: number;
  failed: number;
  /** What ansible-playbook printed (the default callback: task results, diffs, failures as JSON). */
  out: string;
}

function playbook(name: string, tasks: string, flags: string[] = [], whole?: { text: string; inventory: string; path: string }): Promise<PlaybookRun> {
  return new Promise((resolve, reject) => {
    const path = join(dir, `${name}.yml`);
    const text = `- hosts: localhost\n  connection: local\n  gather_facts: false\n  vars:\n    gw: {gwctl: "${BIN('gwctl')}", data_dir: "${gw.dataDir}"}\n  tasks:\n${tasks}`;
    void writeFile(path, whole?.text ?? text).then(() => {
      const child = spawn('ansible-playbook', ['-i', whole?.inventory ?? 'localhost,', path, ...flags], {
        env: {
          PATH: `${whole ? `${whole.path}:` : ''}${process.env.PATH ?? ''}`,
          HOME: dir,
          ANSIBLE_COLLECTIONS_PATH: COLLECTIONS,
          ANSIBLE_COLLECTIONS_SCAN_SYS_PATH: '0',
          ANSIBLE_LOCAL_TEMP: join(dir, 'ansible-tmp'),
          ANSIBLE_REMOTE_TEMP: join(dir, 'ansible-tmp'),
          ANSIBLE_PYTHON_INTERPRETER: '/usr/bin/python3',
          ANSIBLE_NOCOLOR: '1',
          ANSIBLE_RETRY_FILES_ENABLED: '0',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      child.stdout.on('data', (c: Buffer) => (out += c.toString()));
      child.stderr.on('data', (c: Buffer) => (out += c.toString()));
      const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
      child.once('error', reject);
      child.once('close', (status) => {
        clearTimeout(timer);
        const recap = /(?:localhost|auth)\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)/.exec(out);
        if (!recap) return reject(new Error(`ansible-playbook printed no recap (status ${status}):\n${out}`));
        resolve({ status, changed: Number(recap[1]), failed: Number(recap[2]), out });
      });
    });
  });
}

const roleTask = (logins: string, state = 'present') => `    - name: role
      gateway.gateway.gateway_resource:
        gwctl: "{{ gw.gwctl }}"
        data_dir: "{{ gw.data_dir }}"
        state: ${state}
        resource:
          kind: role
          version: v7
          metadata: {name: ansible-ops}
          spec: {allow: {logins: [${logins}]}}
`;
const windowTask = (hour: number, state = 'present') => `    - name: window
      gateway.gateway.gateway_maintenance_window:
        gwctl: "{{ gw.gwctl }}"
        data_dir: "{{ gw.data_dir }}"
        state: ${state}
${state === 'present' ? `        utc_start_hour: ${hour}\n        weekdays: [monday, Fri]\n` : ''}`;
const gwctl = (args: string[]) => runCli('gwctl', ['--data-dir', gw.dataDir, ...args], { env: { HOME: dir } });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-ansible-'));
  gw = await startGateway(['gateway:', '  data_dir: DATA_DIR', 'auth_service:', '  listen_addr: 127.0.0.1:0', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'));
}, 60_000);

afterAll(async () => {
  await gw?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('the gateway.gateway Ansible collection', () => {
  it('check mode first: reports the changes and makes none', async () => {
    const run = await playbook('check', roleTask('ubuntu') + windowTask(2), ['--check']);
    expect(run.status, run.out).toBe(0);
    expect(run.changed).toBe(2);
    expect((await gwctl(['get', 'role/ansible-ops'])).status).toBe(1);
  });

  it('creates a role and the maintenance window (changed=2), then changes nothing (changed=0)', async () => {
    const first = await playbook('site', roleTask('ubuntu') + windowTask(2));
    expect(first.status, first.out).toBe(0);
    expect(first.changed).toBe(2);
    const got = await gwctl(['get', 'cluster_maintenance_config']);
    expect(got.stdout).toContain('utc_start_hour: 2');
    expect(got.stdout).toContain('gateway.dev/apply-set: ansible');
    const second = await playbook('site', roleTask('ubuntu') + windowTask(2));
    expect(second.status, second.out).toBe(0);
    expect(second.changed).toBe(0);
  });

  it('one value changed: changed=1, with the diff in --diff mode', async () => {
    const run = await playbook('site', roleTask('ubuntu') + windowTask(4), ['--diff']);
    expect(run.status, run.out).toBe(0);
    expect(run.changed).toBe(1);
    expect(run.out).toContain('-    utc_start_hour: 2\n+    utc_start_hour: 4');
    expect((await gwctl(['get', 'cluster_maintenance_config'])).stdout).toContain('utc_start_hour: 4');
  });

  it('state absent removes, and a second run reports no change', async () => {
    const gone = await playbook('absent', roleTask('ubuntu', 'absent') + windowTask(0, 'absent'));
    expect(gone.status, gone.out).toBe(0);
    expect(gone.changed).toBe(2);
    expect((await gwctl(['get', 'role/ansible-ops'])).status).toBe(1);
    const again = await playbook('absent', roleTask('ubuntu', 'absent') + windowTask(0, 'absent'));
    expect(again.changed).toBe(0);
  });

  it('src: every document of a manifest file, present then absent', async () => {
    const manifest = join(dir, 'from-src.yaml');
    await writeFile(manifest, 'kind: role\nversion: v7\nmetadata: {name: from-src-a}\n---\nkind: role\nversion: v7\nmetadata: {name: from-src-b}\n');
    const task = (state: string) => `    - name: src\n      gateway.gateway.gateway_resource:\n        gwctl: "{{ gw.gwctl }}"\n        data_dir: "{{ gw.data_dir }}"\n        src: ${manifest}\n        state: ${state}\n`;
    const present = await playbook('src', task('present'));
    expect(present.status, present.out).toBe(0);
    expect(present.changed).toBe(1);
    expect((await gwctl(['get', 'role/from-src-b'])).status).toBe(0);
    expect((await playbook('src', task('present'))).changed).toBe(0);
    const absent = await playbook('src', task('absent'));
    expect(absent.changed).toBe(1);
    expect((await gwctl(['get', 'role/from-src-a'])).status).toBe(1);
    expect((await gwctl(['get', 'role/from-src-b'])).status).toBe(1);
  });

  it('a refused resource fails the task with gwctl\'s code, and nothing is stored', async () => {
    const run = await playbook('bad', roleTask('ubuntu').replace('logins:', 'logns:'));
    expect(run.status).not.toBe(0);
    expect(run.failed).toBe(1);
    const failure = JSON.parse(/fatal: \[localhost\]: FAILED! => (\{.*\})/.exec(run.out)![1]!) as { code: string; msg: string };
    expect(failure.code).toBe('GW_ERR_RESOURCE_INVALID');
    expect(failure.msg).toContain('logns');
    expect((await gwctl(['get', 'role/ansible-ops'])).status).toBe(1);
  });

  it('the playbook of docs/operations.md runs as written (gwctl on PATH), and again with no change', async () => {
    const operations = readFileSync(new URL('../../docs/operations.md', import.meta.url), 'utf8');
    const site = /```yaml\n# site\.yml\n([\s\S]*?)```/.exec(operations)![1]!.replaceAll('/var/lib/gateway', gw.dataDir);
    const bin = join(dir, 'bin');
    await mkdir(bin, { recursive: true });
    await symlink(BIN('gwctl'), join(bin, 'gwctl'));
    const inventory = join(dir, 'inventory');
    await writeFile(inventory, 'auth ansible_connection=local\n');
    const first = await playbook('site-doc', '', [], { text: site, inventory, path: bin });
    expect(first.status, first.out).toBe(0);
    expect(first.changed).toBe(2);
    expect((await gwctl(['get', 'cluster_maintenance_config'])).stdout).toContain('- Fri');
    const second = await playbook('site-doc', '', [], { text: site, inventory, path: bin });
    expect(second.changed).toBe(0);
  });
});
