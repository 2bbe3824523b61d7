/**
 * One output flag on every command that prints data (docs/cli.md#output-formats), with the built CLIs against a
 * real cluster (auth + proxy) and a real agent (an app behind a reverse tunnel): for each command of gwctl, gwsh,
 * gateway and gateway-upgrade, `-f json` parses with JSON.parse and `-f yaml` with the yaml package, both give the
 * same data, and every key of it is snake_case (user data such as labels and traits excepted: their keys are the
 * user's). The old spellings (--json, --format table) still work with a notice on stderr; a bad value is
 * GW_ERR_OUTPUT_FORMAT with exit status 2 and nothing on stdout; `gwctl get` reads every kind `gwctl create`
 * accepts, in the singular and the plural, and never prints a join token's value.
 */
import { existsSync, readFileSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import { runCli, startGateway, type RunningGateway, type RunResult } from '../helpers/gateway.js';

const PASSWORD = 'correct horse battery';
const SNAKE = /^[a-z0-9]+(_[a-z0-9]+)*$/;
/** Maps whose keys are the user's data, not the output's schema (a rollout group's agents are counted by version). */
const USER_MAPS = /(^|_)labels$|^traits$|^versions$/;

/** Every key of value that is not snake_case, as a path. */
function notSnake(value: unknown, path = '$'): string[] {
  if (Array.isArray(value)) return value.flatMap((v, i) => notSnake(v, `${path}[${i}]`));
  if (value === null || typeof value !== 'object') return [];
  return Object.entries(value as Record<string, unknown>).flatMap(([k, v]) => {
    const bad = SNAKE.test(k) ? [] : [`${path}.${k}`];
    return USER_MAPS.test(k) ? bad : [...bad, ...notSnake(v, `${path}.${k}`)];
  });
}

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let echo: net.Server;
let proxyAddr: string;
let tokenValue: string;
let aliceEnv: Record<string, string>;
let upgradeEnv: Record<string, string>;

const gwctl = (args: string[], input?: string): Promise<RunResult> =>
  runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const gwsh = (args: string[]): Promise<RunResult> => runCli('gwsh', args, { env: aliceEnv });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-formats-'));
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  const webPort = await getPort({ host: '127.0.0.1' });
  proxyAddr = `127.0.0.1:${webPort}`;
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      'auth_service:',
      '  cluster_name: formats.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${proxyAddr}`,
      `  public_addr: ${proxyAddr}`,
      '  automatic_upgrades_channels:',
      '    stable/v17: { static_version: v17.0.2 }',
      '',
    ].join('\n'),
  );
  const status = JSON.parse((await gwctl(['status', '-f', 'json'])).stdout) as { ca_pin: string };
  expect((await gwctl(['users', 'add', 'alice', '--roles=access,editor', '--logins=alice'], `${PASSWORD}\n`)).status).toBe(0);
  const created = await gwctl(['tokens', 'add', '--type=app', '--ttl=10m', '-f', 'json']);
  tokenValue = (JSON.parse(created.stdout) as { token: string }).token;
  const manifest = join(dir, 'manifest.yaml');
  await writeFile(
    manifest,
    [
      'kind: role',
      'version: v7',
      'metadata: { name: auditor, description: reads the audit log, labels: { Team-Name: sec } }',
      'spec: { allow: { rules: [ { resources: [event], verbs: [list, read] } ] } }',
      '---',
      'kind: cluster_maintenance_config',
      'version: v1',
      'metadata: { name: cluster-maintenance-config }',
      'spec: { agent_upgrades: { utc_start_hour: 2, weekdays: [Mon] } }',
      '---',
      'kind: autoupdate_config',
      'spec: { agents: { schedules: { regular: [ { name: dev, time_zone: Europe/Paris, canary_count: 1 }, { name: prod } ] } } }',
      '---',
      'kind: autoupdate_version',
      'spec: { agents: { start_version: 17.0.0, target_version: 17.0.2 } }',
      '',
    ].join('\n'),
  );
  expect((await gwctl(['create', manifest])).status).toBe(0);
  expect((await gwctl(['lock', '--user', 'mallory', '--ttl', '1h', '--message', 'formats test'])).status).toBe(0);
  agent = await startGateway(
    [
      'gateway:',
      '  nodename: agent-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: echo, uri: "tcp://127.0.0.1:${(echo.address() as net.AddressInfo).port}", labels: { Env-Name: test } }`,
      '',
    ].join('\n'),
    { args: ['--token', tokenValue, '--ca-pin', status.ca_pin, '--proxy', proxyAddr] },
  );
  await agent.waitForLog('"reverse tunnel ready"', 20_000);
  aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh') };
  const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${status.ca_pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
  expect(login.status, login.stderr).toBe(0);

  // gateway-upgrade against this cluster's version server, with a fake installed version and no real /etc.
  const root = join(dir, 'root');
  await mkdir(join(root, 'etc/gateway-upgrade.d'), { recursive: true });
  await writeFile(join(root, 'etc/gateway-upgrade.d/endpoint'), `${proxyAddr}/v1/webapi/automaticupgrades/channel/stable/v17\n`);
  const fake = join(dir, 'gateway-17.0.1');
  await writeFile(fake, '#!/bin/sh\necho "Gateway v17.0.1 git:test"\n');
  await chmod(fake, 0o755);
  upgradeEnv = {
    GATEWAY_UPGRADE_ROOT: root,
    GATEWAY_UPGRADE_CA_FILE: join(cluster.dataDir, 'admin', 'host-ca.pem'),
    GATEWAY_UPGRADE_VERSION_COMMAND: `${fake} --version`,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: 'apt',
  };
}, 120_000);

afterAll(async () => {
  await agent?.stop();
  await cluster?.stop();
  await new Promise<void>((resolve) => (echo ? echo.close(() => resolve()) : resolve()));
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

type Runner = (args: string[]) => Promise<RunResult>;

/** Every command that prints data, as [program, runner, arguments]; the format flag is added by the test. */
const COMMANDS: Array<[string, () => Runner, string[]]> = [
  ['gwctl', () => gwctl, ['status']],
  // A signed-in user probes from their Proxy (the admin identity would need --proxy); hop times differ per run.
  ['gwctl', () => (args) => runCli('gwctl', args, { env: aliceEnv }), ['probe', 'app', 'echo']],
  ['gwctl', () => gwctl, ['tokens', 'add', '--type=node']],
  ['gwctl', () => gwctl, ['tokens', 'ls']],
  ['gwctl', () => gwctl, ['users', 'ls']],
  ['gwctl', () => gwctl, ['lock', '--user', 'eve', '--ttl', '1h']],
  ...['roles', 'role/auditor', 'users', 'user', 'tokens', 'github', 'saml', 'oidc', 'cluster_maintenance_config', 'locks', 'nodes', 'proxies', 'events', 'autoupdate_config', 'autoupdate_version', 'autoupdate_agent_rollout'].map(
    (kind) => ['gwctl', () => gwctl, ['get', kind]] as [string, () => Runner, string[]],
  ),
  ['gwctl', () => gwctl, ['get', 'role', 'access']],
  // In this order: start needs a group not done, which mark-done ends.
  ...[['status'], ['suspend'], ['resume'], ['rollback', '--now'], ['start'], ['mark-done', '--group', 'dev']].map((a) => ['gwctl', () => gwctl, ['autoupdate', ...a]] as [string, () => Runner, string[]]),
  ['gwsh', () => gwsh, ['status']],
  ['gwsh', () => gwsh, ['ls']],
  ['gwsh', () => gwsh, ['apps', 'ls']],
  ['gwsh', () => gwsh, ['db', 'ls']],
  ['gwsh', () => gwsh, ['desktops', 'ls']],
  ['gwsh', () => gwsh, ['kube', 'ls']],
  ['gateway-upgrade', () => (args) => runCli('gateway-upgrade', args, { env: upgradeEnv }), ['dry-run']],
  ['gateway-upgrade', () => (args) => runCli('gateway-upgrade', args, { env: upgradeEnv }), ['repo', 'show']],
  ['gateway-upgrade', () => (args) => runCli('gateway-upgrade', args, { env: upgradeEnv }), ['version']],
];

/** gwctl get's YAML is a stream of documents (one per resource, as its JSON is an array), the others' one document. */
const yamlData = (args: string[], text: string): unknown =>
  args[0] === 'get' ? parseAllDocuments(text).map((d) => d.toJS() as unknown) : (parseYaml(text) as unknown);

describe('-f json and -f yaml on every command that prints data', () => {
  for (const [program, runner, args] of COMMANDS) {
    it(`${program} ${args.join(' ')}`, async () => {
      const run = runner();
      const json = await run([...args, '-f', 'json']);
      expect(json.status, json.stderr).toBe(0);
      const data = JSON.parse(json.stdout) as unknown;
      expect(notSnake(data)).toEqual([]);
      const yaml = await run([...args, '--format', 'yaml']);
      expect(yaml.status, yaml.stderr).toBe(0);
      const fromYaml = yamlData(args, yaml.stdout);
      expect(notSnake(fromYaml)).toEqual([]);
      // The same data both ways (commands that create something, or read a clock, differ in those values only).
      if (!['tokens add', 'lock --user', 'dry-run', 'get events', 'get nodes', 'get proxies', 'status', 'get locks', 'get tokens', 'tokens ls', 'probe', 'autoupdate', 'get autoupdate_agent_rollout'].some((c) => args.join(' ').startsWith(c))) {
        expect(fromYaml).toEqual(data);
      } else {
        expect(typeof fromYaml).toBe(typeof data);
      }
      const text = await run([...args, '-f', 'text']);
      expect(text.status, text.stderr).toBe(0);
      expect(text.stdout.length).toBeGreaterThan(0);
    });
  }

  it('gateway dial-plan: one JSON object per target per line, one YAML document per target, snake_case', async () => {
    const env = { HTTPS_PROXY: 'http://carol:s3cret@proxy.example:3128', NO_PROXY: 'internal.example' };
    const json = await runCli('gateway', ['dial-plan', 'api.example:443', 'internal.example:443', '-f', 'json'], { env });
    expect(json.status, json.stderr).toBe(0);
    const lines = json.stdout.trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.map((l) => l.target)).toEqual(['api.example:443', 'internal.example:443']);
    expect(notSnake(lines)).toEqual([]);
    const yaml = await runCli('gateway', ['dial-plan', 'api.example:443', 'internal.example:443', '-f', 'yaml'], { env });
    expect(yaml.status, yaml.stderr).toBe(0);
    expect(parseAllDocuments(yaml.stdout).map((d) => d.toJS() as unknown)).toEqual(lines);
    expect(json.stdout + yaml.stdout).not.toContain('s3cret');
  });
});

/** Every command of a program, found through --help as a user finds them: [path, does its help list -f, --format]. */
async function commandTree(program: 'gateway' | 'gwctl' | 'gwsh' | 'gateway-upgrade', path: string[] = []): Promise<Array<[string[], string]>> {
  const help = (await runCli(program, [...path, '--help'])).stdout;
  const commands = (help.split('\nCommands:\n')[1] ?? '')
    .split('\n')
    .map((l) => /^ {2}([a-z][a-z-]*)/.exec(l)?.[1])
    .filter((c): c is string => c !== undefined && c !== 'help');
  const below = await Promise.all(commands.map((c) => commandTree(program, [...path, c])));
  return [...(path.length > 0 ? [[path, help] as [string[], string]] : []), ...below.flat()];
}

describe('gwctl apply: --format (its -f is the file)', () => {
  it('prints the same plan as json and as yaml, snake_case', async () => {
    const manifest = join(dir, 'apply-format.yaml');
    await writeFile(manifest, 'kind: role\nversion: v7\nmetadata: {name: format-check}\n');
    const json = await gwctl(['apply', '-f', manifest, '--dry-run', '--format', 'json']);
    expect(json.status, json.stderr).toBe(0);
    const data = JSON.parse(json.stdout) as unknown;
    expect(notSnake(data)).toEqual([]);
    const yaml = await gwctl(['apply', '-f', manifest, '--dry-run', '--format', 'yaml']);
    expect(parseYaml(yaml.stdout)).toEqual(data);
  });
});

describe('the walk above covers every command that has the flag, and the flag is the same everywhere', () => {
  it('each command whose --help lists --format is in COMMANDS (or is dial-plan); each lists it as -f, --format with the three formats', async () => {
    // The command's words: those before its first flag (gwctl get's and probe's are a kind and a name, not subcommands).
    const words = (args: string[]) => (args[0] === 'get' || args[0] === 'probe' ? [args[0]] : args.slice(0, [...args, '-'].findIndex((a) => a.startsWith('-'))));
    const walked = new Set(COMMANDS.map(([program, , args]) => `${program} ${words(args).join(' ')}`));
    // Checked by their own tests below and above: dial-plan streams records, login needs a password on stdin.
    walked.add('gateway dial-plan');
    walked.add('gwsh login');
    // kube login needs a Kubernetes cluster behind an agent: its -f json is checked in test/e2e/kube-upgrades.test.ts.
    walked.add('gwsh kube login');
    // gwctl apply's -f is its file (as kubectl apply -f): --format only, checked below.
    walked.add('gwctl apply');
    const missing: string[] = [];
    for (const program of ['gateway', 'gwctl', 'gwsh', 'gateway-upgrade'] as const) {
      for (const [path, help] of await commandTree(program)) {
        if (!help.includes('--format')) continue;
        const flag = `${program} ${path.join(' ')}` === 'gwctl apply' ? / {2}--format <format>\s+output format: text, json, yaml/ : /-f, --format <format>\s+output format: text, json, yaml/;
        expect(help, `${program} ${path.join(' ')}`).toMatch(flag);
        if (!walked.has(`${program} ${path.join(' ')}`)) missing.push(`${program} ${path.join(' ')}`);
      }
    }
    expect(missing).toEqual([]);
  });
});

describe('old spellings keep working, with a notice', () => {
  it('gateway dial-plan --json prints what -f json prints, and says it is deprecated on stderr only', async () => {
    const env = { HTTPS_PROXY: 'http://proxy.example:3128' };
    const old = await runCli('gateway', ['dial-plan', 'api.example:443', '--json'], { env });
    const now = await runCli('gateway', ['dial-plan', 'api.example:443', '-f', 'json'], { env });
    expect(old.status).toBe(0);
    expect(old.stdout).toBe(now.stdout);
    expect(old.stderr).toBe('warning: --json is deprecated; use --format json (or -f json)\n');
    expect(now.stderr).toBe('');
    const clash = await runCli('gateway', ['dial-plan', 'api.example:443', '--json', '-f', 'yaml'], { env });
    expect(clash.status).toBe(2);
    expect(clash.stdout).toBe('');
    expect(clash.stderr).toContain('code: GW_ERR_OUTPUT_FORMAT');
  });

  it('gwctl get events --format table prints the text table, with a notice', async () => {
    const old = await gwctl(['get', 'events', '--format', 'table']);
    expect(old.status, old.stderr).toBe(0);
    expect(old.stdout.split('\n')[0]).toMatch(/^TIME\s+EVENT\s+USER\s+RESOURCE/);
    expect(old.stderr).toBe('warning: --format table is deprecated; use --format text\n');
  });

  it('gwsh login -f json prints the profile as gwsh status -f json does', async () => {
    const pin = (JSON.parse((await gwctl(['status', '-f', 'json'])).stdout) as { ca_pin: string }).ca_pin;
    const env = { HOME: dir, GWSH_HOME: join(dir, 'alice-again') };
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${pin}`, '-f', 'json'], { env, input: `${PASSWORD}\n` });
    expect(login.status, login.stderr).toBe(0);
    const status = await runCli('gwsh', ['status', '-f', 'json'], { env });
    expect(JSON.parse(login.stdout)).toEqual(JSON.parse(status.stdout));
    expect(notSnake(JSON.parse(login.stdout))).toEqual([]);
  });

  it('gwsh status -f json (the seed) still has active.username and active.roles', async () => {
    const r = await gwsh(['status', '-f', 'json']);
    const { active } = JSON.parse(r.stdout) as { active: { username: string; roles: string[] } };
    expect(active.username).toBe('alice');
    expect(active.roles).toEqual(['access', 'editor']);
  });
});

describe('a bad --format', () => {
  for (const [program, runner, args] of [...COMMANDS.filter(([, , a]) => a[0] !== 'tokens' && a[0] !== 'lock'), ['gateway', () => (a: string[]) => runCli('gateway', a), ['dial-plan', 'api.example:443']]] as Array<
    [string, () => Runner, string[]]
  >) {
    it(`${program} ${args.join(' ')} -f xml: GW_ERR_OUTPUT_FORMAT naming the formats, status 2, nothing on stdout`, async () => {
      const r = await runner()([...args, '-f', 'xml']);
      expect(r.status).toBe(2);
      expect(r.stdout).toBe('');
      expect(r.stderr).toContain('code: GW_ERR_OUTPUT_FORMAT');
      expect(r.stderr).toContain('text, json, yaml');
    });
  }

  it('gwctl tokens add -f xml creates no token', async () => {
    const before = (JSON.parse((await gwctl(['tokens', 'ls', '-f', 'json'])).stdout) as unknown[]).length;
    const r = await gwctl(['tokens', 'add', '--type=node', '-f', 'xml']);
    expect(r.status).toBe(2);
    expect(r.stdout).toBe('');
    expect((JSON.parse((await gwctl(['tokens', 'ls', '-f', 'json'])).stdout) as unknown[]).length).toBe(before);
  });
});

describe('gwctl get for every kind gwctl create accepts', () => {
  it('roles, users and tokens in the plural, with text tables', async () => {
    const roles = await gwctl(['get', 'roles', '-f', 'text']);
    expect(roles.stdout.split('\n')[0]).toMatch(/^Role\s+Logins/);
    expect(roles.stdout).toMatch(/^auditor\s.*reads the audit log$/m);
    expect(roles.stdout).toMatch(/^access\s/m);
    const users = await gwctl(['get', 'users', '-f', 'text']);
    expect(users.stdout).toMatch(/^alice\s+access,editor\s+alice\s+local$/m);
    const tokens = await gwctl(['get', 'tokens', '-f', 'text']);
    expect(tokens.stdout.split('\n')[0]).toMatch(/^Id\s+Types\s+Uses\s+Expires$/);
    const mcfg = await gwctl(['get', 'cluster_maintenance_config', '-f', 'text']);
    expect(mcfg.stdout).toMatch(/^cluster-maintenance-config\s+2\s+Mon$/m);
    const locks = await gwctl(['get', 'locks', '-f', 'text']);
    expect(locks.stdout).toMatch(/user=mallory\s+formats test/);
  });

  it('a token is listed by its id, never by its value, in every format', async () => {
    for (const format of ['text', 'json', 'yaml']) {
      for (const kind of ['tokens', 'token']) {
        const r = await gwctl(['get', kind, '-f', format]);
        expect(r.status).toBe(0);
        expect(r.stdout).not.toContain(tokenValue);
      }
    }
    const withSecrets = await gwctl(['get', 'tokens', '--with-secrets', '-f', 'json']);
    expect(withSecrets.stdout).not.toContain(tokenValue);
  });

  it('KIND NAME, KIND/NAME, and a name that does not exist', async () => {
    const one = JSON.parse((await gwctl(['get', 'roles', 'auditor', '-f', 'json'])).stdout) as Array<{ metadata: { name: string } }>;
    expect(one.map((r) => r.metadata.name)).toEqual(['auditor']);
    expect((await gwctl(['get', 'role/auditor', '-f', 'json'])).stdout).toBe((await gwctl(['get', 'role', 'auditor', '-f', 'json'])).stdout);
    const missing = await gwctl(['get', 'token', '0123456789ab']);
    expect(missing.status).toBe(1);
    expect(missing.stderr).toContain('code: GW_ERR_RESOURCE_NOT_FOUND');
    const both = await gwctl(['get', 'role/auditor', 'access']);
    expect(both.status).toBe(2);
  });

  it('-o json (kubectl\'s habit) is refused rather than writing a file named json; -o ./json writes it', async () => {
    const r = await runCli('gwctl', ['--data-dir', cluster.dataDir, 'get', 'roles', '-o', 'json'], { env: { HOME: dir }, cwd: dir });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
    expect(r.stderr).toContain('hint: Give -f json for the format');
    expect(existsSync(join(dir, 'json'))).toBe(false);
    const file = await runCli('gwctl', ['--data-dir', cluster.dataDir, 'get', 'roles', '-o', './json', '-f', 'json'], { env: { HOME: dir }, cwd: dir });
    expect(file.status, file.stderr).toBe(0);
    expect((JSON.parse(readFileSync(join(dir, 'json'), 'utf8')) as unknown[]).length).toBeGreaterThan(0);
  });

  it('a kind that does not exist: GW_ERR_RESOURCE_KIND listing the kinds', async () => {
    for (const kind of ['widgets', 'constructor', '__proto__']) {
      const r = await gwctl(['get', kind]);
      expect(r.status).toBe(1);
      expect(r.stdout).toBe('');
      expect(r.stderr).toContain('code: GW_ERR_RESOURCE_KIND');
      expect(r.stderr).toContain('role, user, token, github, saml, oidc, cluster_maintenance_config, lock, autoupdate_config, autoupdate_version, node, proxy, event, autoupdate_agent_rollout');
    }
  });
});
