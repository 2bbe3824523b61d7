/**
 * gwctl apply against a real daemon (auth + proxy on loopback): the plan (create / update with a diff /
 * unchanged), --dry-run and --exit-code, --prune within the apply set only, secrets shown as ***, and the hostile
 * cases: a refused document among good ones, the same resource in two files, a 10 MB file, 10 000 documents, an
 * alias bomb, a symlink loop and a directory loop. After each refusal nothing stored has changed.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';

let dir: string;
let gw: RunningGateway;

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', gw.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const file = async (name: string, text: string): Promise<string> => {
  const path = join(dir, name);
  await mkdir(join(path, '..'), { recursive: true });
  await writeFile(path, text);
  return path;
};
const role = (name: string, logins: string[]) => `kind: role\nversion: v7\nmetadata: {name: ${name}}\nspec:\n  allow:\n    logins: [${logins.join(', ')}]\n`;
const MAINTENANCE = 'kind: cluster_maintenance_config\nspec:\n  agent_upgrades: {utc_start_hour: 2, weekdays: [Mon]}\n';
const plan = async (args: string[]) => {
  const r = await gwctl(['apply', '--format', 'json', ...args]);
  expect(r.stderr).toBe('');
  return JSON.parse(r.stdout) as { applied: boolean; plan: Array<{ kind: string; name: string; action: string; diff?: string }> };
};
const actions = (p: { plan: Array<{ kind: string; name: string; action: string }> }) => p.plan.map((e) => `${e.kind}/${e.name}:${e.action}`);
const stored = async () => (await gwctl(['get', 'roles', '--format', 'json'])).stdout + (await gwctl(['get', 'users', '--format', 'json'])).stdout;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-apply-'));
  gw = await startGateway(['gateway:', '  data_dir: DATA_DIR', 'auth_service:', '  listen_addr: 127.0.0.1:0', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'));
}, 60_000);

afterAll(async () => {
  await gw?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('gwctl apply', () => {
  it('plans creates, applies them in one go, then reports them unchanged', async () => {
    const d = join(dir, 'base');
    await file('base/10-roles.yaml', `${role('dev', ['ubuntu'])}---\n${role('ops', ['root'])}`);
    await file('base/20-maint.yml', MAINTENANCE);
    await file('base/30-user.json', JSON.stringify({ kind: 'user', version: 'v2', metadata: { name: 'alice' }, spec: { roles: ['dev'] } }));
    await file('base/notes.txt', 'not a manifest');
    const dry = await plan(['-f', d, '--dry-run']);
    expect(actions(dry)).toEqual(['role/dev:create', 'role/ops:create', 'cluster_maintenance_config/cluster-maintenance-config:create', 'user/alice:create']);
    expect(dry.applied).toBe(false);
    expect((await gwctl(['get', 'role/dev'])).status).toBe(1); // the dry run stored nothing
    const pending = await gwctl(['apply', '-f', d, '--dry-run', '--exit-code']);
    expect(pending.status).toBe(3);
    expect(pending.stdout).toContain('Plan (apply set "default"): 4 to create, 0 to update, 0 to delete, 0 unchanged.');
    const applied = await plan(['-f', d]);
    expect(applied.applied).toBe(true);
    const got = await gwctl(['get', 'role/dev']);
    expect(got.stdout).toContain('gateway.dev/managed-by: gwctl-apply');
    expect(got.stdout).toContain('gateway.dev/apply-set: default');
    const again = await gwctl(['apply', '-f', d, '--exit-code']);
    expect(again.status).toBe(0);
    expect(again.stdout).toContain('0 to create, 0 to update, 0 to delete, 4 unchanged.');
  });

  it('shows an update as a unified diff and applies only that', async () => {
    const d = join(dir, 'base');
    await file('base/10-roles.yaml', `${role('dev', ['ubuntu', 'deploy'])}---\n${role('ops', ['root'])}`);
    const r = await gwctl(['apply', '-f', d, '--dry-run']);
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('role/dev: update');
    expect(r.stdout).toMatch(/--- role\/dev \(stored\)\n\s+\+\+\+ role\/dev \(apply\)\n\s+@@ /);
    expect(r.stdout).toContain('\n           - ubuntu\n    +      - deploy\n');
    expect(r.stdout).toContain('role/ops: unchanged');
    expect(actions(await plan(['-f', d]))).toContain('role/dev:update');
    expect((await gwctl(['get', 'role/dev'])).stdout).toContain('deploy');
  });

  it('prunes only the members of its apply set: not presets, not resources made by hand, not another set', async () => {
    await file('hand.yaml', role('by-hand', ['x']));
    expect((await gwctl(['create', join(dir, 'hand.yaml')])).status).toBe(0);
    await file('other/a.yaml', role('other-set', ['y']));
    expect((await gwctl(['apply', '-f', join(dir, 'other'), '--set', 'team-b'])).status).toBe(0);
    await rm(join(dir, 'base', '30-user.json'));
    await file('base/10-roles.yaml', role('dev', ['ubuntu', 'deploy']));
    const noPrune = await plan(['-f', join(dir, 'base'), '--dry-run']);
    expect(noPrune.plan.some((e) => e.action === 'delete')).toBe(false);
    const pruned = await plan(['-f', join(dir, 'base'), '--prune']);
    expect(actions(pruned).filter((a) => a.endsWith(':delete')).sort()).toEqual(['role/ops:delete', 'user/alice:delete']);
    expect((await gwctl(['get', 'role/ops'])).status).toBe(1);
    expect((await gwctl(['get', 'role/by-hand'])).status).toBe(0);
    expect((await gwctl(['get', 'role/other-set'])).status).toBe(0);
    expect((await gwctl(['get', 'role/access'])).status).toBe(0);
  });

  it('shows secrets as *** and a changed secret as "*** (changed)", never the secret', async () => {
    const oidc = (secret: string) =>
      `kind: oidc\nversion: v3\nmetadata: {name: corp}\nspec:\n  issuer_url: https://idp.example.com\n  client_id: gw\n  client_secret: ${secret}\n  redirect_url: https://gw.example.com/webapi/sso/oidc/callback\n  claims_to_roles:\n    - {claim: groups, value: admins, roles: [dev]}\n`;
    await file('sso/oidc.yaml', oidc('first-secret-value'));
    expect((await gwctl(['apply', '-f', join(dir, 'sso'), '--set', 'sso'])).status).toBe(0);
    expect(actions(await plan(['-f', join(dir, 'sso'), '--set', 'sso']))).toEqual(['oidc/corp:unchanged']);
    await file('sso/oidc.yaml', oidc('second-secret-value'));
    const r = await gwctl(['apply', '-f', join(dir, 'sso'), '--set', 'sso', '--dry-run']);
    expect(r.stdout).toContain('oidc/corp: update');
    expect(r.stdout).toContain('+  client_secret: "*** (changed)"');
    expect(r.stdout).not.toContain('secret-value');
  });

  it('a lock (created_at and created_by set by the Auth Service) is unchanged on the second run; a new connector\'s plan holds no secret', async () => {
    await file('locks/l.yaml', 'kind: lock\nversion: v2\nmetadata: {name: freeze}\nspec:\n  target: {role: nobody-holds-this}\n  message: change freeze\n  expires: "2030-01-31T23:59:59+02:00"\n');
    expect(actions(await plan(['-f', join(dir, 'locks'), '--set', 'locks']))).toEqual(['lock/freeze:create']);
    expect(actions(await plan(['-f', join(dir, 'locks'), '--set', 'locks']))).toEqual(['lock/freeze:unchanged']);
    await file('sso2/github.yaml', 'kind: github\nversion: v3\nmetadata: {name: gh}\nspec:\n  client_id: id\n  client_secret: github-secret-never-shown\n  redirect_url: https://gw.example.com/webapi/sso/github/callback\n  teams_to_roles: [{organization: o, team: t, roles: [access]}]\n');
    const r = await gwctl(['apply', '-f', join(dir, 'sso2'), '--dry-run', '--format', 'json']);
    expect(r.stdout).toContain('"action": "create"');
    expect(r.stdout).toContain('client_secret: \\"***\\"');
    expect(r.stdout).not.toContain('github-secret-never-shown');
  });

  it('applies a token by its hash: unchanged on the second run, shown by its id only', async () => {
    const token = 'a3f5c1e9b7d4f2a6c0e8b1d3f5a7c9e1';
    await file('tokens/t.yaml', `kind: token\nversion: v2\nmetadata: {name: ${token}}\nspec: {roles: [node], uses: 0}\n`);
    const first = await gwctl(['apply', '-f', join(dir, 'tokens'), '--set', 'tokens']);
    expect(first.stdout).toMatch(/token\/[0-9a-f]{12}: create/);
    expect(first.stdout).not.toContain(token);
    expect((await gwctl(['apply', '-f', join(dir, 'tokens'), '--set', 'tokens'])).stdout).toMatch(/token\/[0-9a-f]{12}: unchanged/);
  });
});

describe('the example of docs/resources.md', () => {
  it('applies as written, and a changed hour prints the documented plan', async () => {
    const section = readFileSync(new URL('../../docs/resources.md', import.meta.url), 'utf8').split('## gwctl apply: resources as code')[1]!;
    const blocks = (lang: string) => [...section.matchAll(new RegExp('```' + lang + '\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]!);
    const [roles, maintenance] = blocks('yaml');
    await file('platform/10-roles.yaml', roles!);
    await file('platform/20-maintenance.yaml', maintenance!);
    expect((await gwctl(['apply', '-f', join(dir, 'platform')])).status).toBe(0);
    await file('platform/20-maintenance.yaml', maintenance!.replace('utc_start_hour: 2', 'utc_start_hour: 3'));
    const r = await gwctl(['apply', '-f', join(dir, 'platform')]);
    expect(r.stdout).toBe(/the plan reads:\n\n```\n([\s\S]*?)```/.exec(section)![1]);
  });
});

describe('gwctl apply refuses, and changes nothing', () => {
  it('a refused document among good ones: nothing applied, every problem listed', async () => {
    const before = await stored();
    await file('bad/1.yaml', `${role('good-one', ['a'])}---\nkind: rol\nversion: v7\nmetadata: {name: x}\n`);
    await file('bad/2.yaml', `${role('good-two', ['b'])}---\nkind: role\nversion: v7\nmetadata: {name: y}\nspec: {allow: {logns: [z]}}\n`);
    const r = await gwctl(['apply', '-f', join(dir, 'bad')]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_RESOURCE_INVALID');
    expect(r.stderr).toContain('unknown kind "rol"');
    expect(r.stderr).toContain('logns');
    expect(await stored()).toBe(before);
  });

  it('the same resource in two files', async () => {
    await file('twice/a.yaml', role('twin', ['a']));
    await file('twice/b.yaml', role('twin', ['b']));
    const r = await gwctl(['apply', '-f', join(dir, 'twice')]);
    expect(r.stderr).toMatch(/role "twin" is defined in .*a\.yaml too/);
    expect((await gwctl(['get', 'role/twin'])).status).toBe(1);
  });

  it('a user naming a role that does not exist (checked before the first write)', async () => {
    const before = await stored();
    await file('norole/a.yaml', `${role('fine', ['a'])}---\nkind: user\nversion: v2\nmetadata: {name: bob}\nspec: {roles: [nonexistent]}\n`);
    const r = await gwctl(['apply', '-f', join(dir, 'norole')]);
    expect(r.stderr).toContain('code: GW_ERR_RESOURCE_NOT_FOUND');
    expect(await stored()).toBe(before);
  });

  it('a 10 MB file, refused by its size before it is read', async () => {
    await file('big/big.yaml', `${role('big', ['a'])}# ${'x'.repeat(10 * 1024 * 1024)}\n`);
    const r = await gwctl(['apply', '-f', join(dir, 'big')]);
    expect(r.stderr).toContain('code: GW_ERR_APPLY_TOO_LARGE');
    expect((await gwctl(['get', 'role/big'])).status).toBe(1);
  });

  it('10 000 documents', async () => {
    const docs = Array.from({ length: 10_000 }, (_, i) => `kind: role\nversion: v7\nmetadata: {name: r${i}}\n`).join('---\n');
    await file('many/many.yaml', docs);
    const r = await gwctl(['apply', '-f', join(dir, 'many')]);
    expect(r.stderr).toContain('code: GW_ERR_APPLY_TOO_LARGE');
    expect(r.stderr).toContain('10000 resources');
    expect((await gwctl(['get', 'role/r0'])).status).toBe(1);
  });

  it('an alias bomb (billion laughs)', async () => {
    const levels = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'];
    // 20 levels of 9: a reader that expands aliases would build 9^20 strings.
    for (let i = 1; i < 20; i++) levels.push(`${String.fromCharCode(97 + i)}: &${String.fromCharCode(97 + i)} [${Array(9).fill(`*${String.fromCharCode(96 + i)}`).join(',')}]`);
    await file('bomb/bomb.yaml', `kind: role\nversion: v7\nmetadata:\n  name: bomb\n  labels:\n${levels.map((l) => `    ${l}`).join('\n')}\n`);
    const r = await gwctl(['apply', '-f', join(dir, 'bomb')], undefined);
    expect(r.stderr).toContain('code: GW_ERR_RESOURCE_INVALID');
    expect((await gwctl(['get', 'role/bomb'])).status).toBe(1);
  });

  it('a symlink loop and a directory loop', async () => {
    await mkdir(join(dir, 'loop'), { recursive: true });
    await symlink('self.yaml', join(dir, 'loop', 'self.yaml'));
    const r = await gwctl(['apply', '-f', join(dir, 'loop')]);
    expect(r.stderr).toContain('a symbolic link loop');
    expect(r.stderr).toContain('code: GW_ERR_APPLY_SOURCE');
    await mkdir(join(dir, 'dirloop', 'sub'), { recursive: true });
    await file('dirloop/sub/r.yaml', role('in-loop', ['a']));
    await symlink('..', join(dir, 'dirloop', 'sub', 'up'));
    const l = await gwctl(['apply', '-R', '-f', join(dir, 'dirloop')]);
    expect(l.stderr).toContain('a directory loop');
    expect((await gwctl(['get', 'role/in-loop'])).status).toBe(1);
    const flat = await gwctl(['apply', '-f', join(dir, 'dirloop')]);
    expect(flat.stderr).toContain('give -R');
  });

  it('a FIFO named as the file (read, it would never end): refused unread', async () => {
    const fifo = join(dir, 'fifo.yaml');
    expect(spawnSync('mkfifo', [fifo]).status).toBe(0);
    const r = await gwctl(['apply', '-f', fifo]);
    expect(r.stderr).toContain('not a regular file or a directory');
    expect(r.stderr).toContain('code: GW_ERR_APPLY_SOURCE');
  });
});
