/**
 * The documented examples stay true: the cluster_maintenance_config manifests of docs/upgrades.md and
 * docs/resources.md go through the real manifest parser and mean what their comments say, and the step-by-step
 * session of docs/cli.md ("gwctl and gwsh in a cluster") runs line by line against a real cluster behind a real
 * squid — including `gwsh logout && gwsh login` without --ca-pin, which works because logout keeps the CA.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { words as shellWords } from '../helpers/shell.js';
import { parseManifest } from '../../src/auth/resources/index.js';
import type { ClusterMaintenanceConfig } from '../../src/auth/resources/types.js';
import { GatewayError } from '../../src/errors.js';
import { nextWindows } from '../../src/upgrade/windows.js';
import { runCli, startGateway, type RunResult, type RunningGateway } from '../helpers/gateway.js';
import { startSquid, type Squid } from '../helpers/squid.js';

const doc = (name: string) => readFileSync(new URL(`../../docs/${name}`, import.meta.url), 'utf8');
const fenced = (text: string, lang: string) => [...text.matchAll(new RegExp('```' + lang + '\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]!);

const UPGRADES = doc('upgrades.md');
const RESOURCES = doc('resources.md');
const maintenanceExamples = [...fenced(UPGRADES, 'yaml'), ...fenced(RESOURCES, 'yaml')].filter((y) => y.includes('kind: cluster_maintenance_config'));
const roleExample = fenced(RESOURCES, 'yaml').find((y) => y.includes('name: maintenance-admin'))!;

function refusal(text: string): GatewayError {
  try {
    parseManifest(text, 'doc.yaml');
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error(`accepted:\n${text}`);
}

describe('cluster_maintenance_config examples in docs/upgrades.md and docs/resources.md', () => {
  it('there are some, and each is valid for the real parser', () => {
    expect(maintenanceExamples.length).toBeGreaterThanOrEqual(2);
    for (const example of maintenanceExamples) {
      const [config] = parseManifest(example, 'doc.yaml') as ClusterMaintenanceConfig[];
      expect(config!.spec.agent_upgrades.weekdays.length).toBeGreaterThan(0);
      expect(nextWindows(config!, new Date('2026-01-05T00:00:00Z'), 1)).toHaveLength(1);
    }
  });

  it('the weekdays comment of docs/upgrades.md is what the parser does', () => {
    const example = maintenanceExamples.find((y) => y.includes('weekdays:') && y.includes('#'))!;
    const comment = /weekdays:.*#(.*)$/m.exec(example)![1]!;
    expect(comment).toContain('short or long names, any case');
    expect(comment).toContain('["*"] or leaving it out: every day');
    expect(comment).toContain('not []');
    const withDays = (days: string) => example.replace(/weekdays:.*$/m, `weekdays: ${days}`);
    const days = (text: string) => (parseManifest(text, 'doc.yaml')[0] as ClusterMaintenanceConfig).spec.agent_upgrades.weekdays;
    expect(days(withDays('[monday, WED, Fri]'))).toEqual(['Mon', 'Wed', 'Fri']);
    expect(days(withDays('["*"]'))).toEqual(['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat']);
    expect(days(example.replace(/^\s*weekdays:.*\n/m, ''))).toEqual(['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat']);
    const empty = refusal(withDays('[]'));
    expect(empty.details.problems).toEqual([expect.objectContaining({ code: 'GW_ERR_CONFIG_VALUE', path: 'spec.agent_upgrades.weekdays' })]);
    expect(empty.hint).toContain('["*"] for every day');
  });
});

// --- docs/cli.md, "gwctl and gwsh in a cluster, step by step" ---------------------------------------------------

const PROXY_IP = '127.0.0.14';
const PROXY_NAME = 'gateway.example.com';
const PASSWORD = 'correct horse battery';

let dir: string;
let squid: Squid;
let cluster: RunningGateway;
let webPort: number;

/** The session's lines: comments removed, `a && b` split; each with the comment it had. */
function sessionLines(): Array<{ command: string; comment: string }> {
  const block = fenced(doc('cli.md'), 'sh').find((b) => b.includes('gwsh logout && gwsh login'));
  expect(block).toBeDefined();
  return block!
    .split('\n')
    .map((line) => /^([^#]*?)\s*(?:#\s*(.*))?$/.exec(line)!)
    .filter((m) => m[1]!.trim() !== '')
    .flatMap((m) => m[1]!.split('&&').map((command) => ({ command: command.trim(), comment: m[2] ?? '' })));
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-docs-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  webPort = await getPort({ host: PROXY_IP });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: auth-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: docs.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${webPort}`,
      `  public_addr: ${PROXY_NAME}:${webPort}`,
      '',
    ].join('\n'),
  );
  await writeFile(join(dir, 'maintenance-admin-role.yaml'), roleExample);
  await writeFile(join(dir, 'maintenance.yaml'), maintenanceExamples[0]!);
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
  await squid?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('docs/cli.md: the step-by-step session runs as written', () => {
  it('every line succeeds, and the login after logout needs no --ca-pin', async () => {
    const lines = sessionLines();
    expect(lines.map((l) => l.command.split(' ').slice(0, 2).join(' '))).toEqual([
      'gwctl users',
      'gwctl status',
      'export HTTPS_PROXY=http://squid.corp.example:3128',
      'gwsh login',
      'gwsh status',
      'gwctl create',
      'gwctl users',
      'gwsh logout',
      'gwsh login',
      'gwctl create',
      'gwctl lock',
      'gwctl get',
      'gwctl unlock',
    ]);
    const alice: Record<string, string> = { HOME: dir, GWSH_HOME: join(dir, 'alice') };
    // On the auth machine gwctl uses the local admin identity of the data directory (--data-dir here).
    const asAdmin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
    let pin = '';
    for (const { command, comment } of lines) {
      const words = shellWords(command, {}); // quoting as a shell reads it: --message "incident 42: ...".
      const args = words.slice(1).map((w) => w.replace(`${PROXY_NAME}:443`, `${PROXY_NAME}:${webPort}`).replace('sha256:...', pin));
      let r: RunResult;
      if (words[0] === 'export') {
        expect(command).toMatch(/^export HTTPS_PROXY=http:\/\/\S+$/);
        alice.HTTPS_PROXY = squid.url; // alice's corporate proxy
        continue;
      } else if (words[0] === 'gwsh') {
        r = await runCli('gwsh', args, { env: alice, input: `${PASSWORD}\n` });
      } else {
        // gwctl: the admin's, except the last line, which alice runs with her new roles.
        const isAlice = command === 'gwctl create maintenance.yaml';
        r = isAlice ? await runCli('gwctl', args.map((a) => (a.endsWith('.yaml') ? join(dir, a) : a)), { env: alice }) : await asAdmin(args.map((a) => (a.endsWith('.yaml') ? join(dir, a) : a)), `${PASSWORD}\n`);
      }
      expect({ command, stderr: r.stderr, status: r.status }).toEqual({ command, stderr: '', status: 0 });
      if (command === 'gwctl status') pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(r.stdout)![1]!;
      if (comment.startsWith('"')) expect(r.stdout).toContain(comment.replaceAll('"', ''));
      if (command === 'gwsh logout') expect(r.stdout).toContain(`the CA of cluster docs.example stays trusted for ${PROXY_NAME}:${webPort}`);
    }
    await squid.waitForAccessLog((l) => l.includes(`CONNECT ${PROXY_NAME}:${webPort} 200`));
    const status = JSON.parse((await runCli('gwsh', ['status', '-f', 'json'], { env: alice })).stdout) as { active: { roles: string[] } };
    expect(status.active.roles).toEqual(['access', 'maintenance-admin']);
  });

  it('a wrong --ca-pin is refused before anything is sent, and leaves the kept CA as it was', async () => {
    const env = { HOME: dir, GWSH_HOME: join(dir, 'alice'), HTTPS_PROXY: squid.url };
    const wrong = await runCli('gwsh', ['login', `--proxy=${PROXY_NAME}:${webPort}`, '--user=alice', `--ca-pin=sha256:${'0'.repeat(64)}`], { env, input: `${PASSWORD}\n` });
    expect(wrong.status).toBe(1);
    expect(wrong.stderr).toContain('GW_ERR_AUTH_PIN_MISMATCH');
    expect((await runCli('gwsh', ['logout'], { env })).status).toBe(0);
    const again = await runCli('gwsh', ['login', `--proxy=${PROXY_NAME}:${webPort}`, '--user=alice'], { env, input: `${PASSWORD}\n` });
    expect(again.stderr).toBe('');
  });

  it('a login to another proxy address with no kept CA still needs the pin', async () => {
    const env = { HOME: dir, GWSH_HOME: join(dir, 'alice') };
    const r = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${webPort}`, '--user=alice'], { env, input: `${PASSWORD}\n` });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_CLIENT_UNTRUSTED');
    expect(r.stderr).toContain('--ca-pin');
  });
});
