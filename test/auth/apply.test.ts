/**
 * The Applier (src/auth/apply.ts) on an in-memory SQLite backend: a write raced between the plan and the write is
 * refused whole (GW_ERR_APPLY_CONFLICT, nothing applied), the caller's rules are checked before any write (read
 * for the diff, delete for --prune), a token keeps its use count over an update; and the unified diff
 * (src/auth/resources/diff.ts) on its own, bounded on inputs too big for its table.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { openSqliteBackend } from '../../src/backend/index.js';
import type { Identity } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { parseManifest, unifiedDiff } from '../../src/auth/resources/index.js';
import { codeOf } from '../helpers/errors.js';

let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
let admin: Identity;
let now = Date.parse('2026-11-21T10:00:00Z');
const role = (name: string, login = 'a') => `kind: role\nversion: v7\nmetadata: {name: ${name}}\nspec: {allow: {logins: [${login}]}}\n`;
const apply = (who: Identity, text: string, options: { dryRun?: boolean; prune?: boolean; set?: string } = {}) =>
  auth.applyResources(who, parseManifest(text, 'test.yaml'), { dryRun: options.dryRun ?? false, prune: options.prune ?? false, set: options.set ?? 'default' });
const names = async () => (await auth.getResources(admin, 'roles', undefined, false)).map((r) => r.metadata.name);

beforeEach(async () => {
  now = Date.parse('2026-11-21T10:00:00Z');
  backend = openSqliteBackend({ path: ':memory:', clock: () => now, sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'unit.example', clock: () => now });
  admin = auth.adminIdentity();
});

afterEach(async () => {
  await backend.close();
});

describe('Applier', () => {
  it('a resource changed by someone else between the plan and the write: nothing applied, GW_ERR_APPLY_CONFLICT', async () => {
    await apply(admin, role('dev'));
    const write = backend.atomicWrite.bind(backend);
    vi.spyOn(backend, 'atomicWrite').mockImplementationOnce(async (conditions, ops) => {
      // Another administrator edits dev after apply read it.
      await backend.put('/roles/dev', JSON.stringify(parseManifest(role('dev', 'theirs'), 'x')[0]));
      return write(conditions, ops);
    });
    expect(await codeOf(apply(admin, `${role('dev', 'mine')}---\n${role('new-one')}`))).toBe('GW_ERR_APPLY_CONFLICT');
    expect(await names()).not.toContain('new-one');
    expect(JSON.stringify(await auth.getResources(admin, 'role', 'dev', false))).toContain('theirs');
  });

  it('a resource created by someone else meanwhile: refused too', async () => {
    const write = backend.atomicWrite.bind(backend);
    vi.spyOn(backend, 'atomicWrite').mockImplementationOnce(async (conditions, ops) => {
      await backend.put('/roles/dev', JSON.stringify(parseManifest(role('dev', 'theirs'), 'x')[0]));
      return write(conditions, ops);
    });
    expect(await codeOf(apply(admin, role('dev', 'mine')))).toBe('GW_ERR_APPLY_CONFLICT');
  });

  it('checks every rule before the first write: a caller who may create roles but not delete them cannot prune', async () => {
    await apply(admin, `${role('keeper')}---\n${role('goner')}`);
    await auth.createResources(admin, parseManifest('kind: role\nversion: v7\nmetadata: {name: writer}\nspec: {allow: {rules: [{resources: [role], verbs: [list, read, create, update]}]}}\n', 'w'), false);
    const writer: Identity = { kind: 'user', name: 'w', cluster: 'unit.example', roles: ['writer'] };
    await auth.addUser(admin, 'w', ['writer'], 'correct horse battery');
    expect(await codeOf(apply(writer, `${role('keeper', 'changed')}---\n${role('third')}`, { prune: true }))).toBe('GW_ERR_ACCESS_DENIED');
    expect(await names()).toEqual(expect.arrayContaining(['keeper', 'goner']));
    expect(await names()).not.toContain('third');
    // Without --prune the same caller applies.
    expect((await apply(writer, role('third'))).applied).toBe(true);
  });

  it('a caller who may write but not read a kind sees no diff: refused', async () => {
    await auth.createResources(admin, parseManifest('kind: role\nversion: v7\nmetadata: {name: blind}\nspec: {allow: {rules: [{resources: [role], verbs: [create, update]}]}}\n', 'b'), false);
    await auth.addUser(admin, 'b', ['blind'], 'correct horse battery');
    const blind: Identity = { kind: 'user', name: 'b', cluster: 'unit.example', roles: ['blind'] };
    expect(await codeOf(apply(blind, role('dev'), { dryRun: true }))).toBe('GW_ERR_ACCESS_DENIED');
  });

  it('a user may name a role that the same apply creates (and only then)', async () => {
    const user = 'kind: user\nversion: v2\nmetadata: {name: carol}\nspec: {roles: [fresh]}\n';
    expect(await codeOf(apply(admin, user))).toBe('GW_ERR_RESOURCE_NOT_FOUND');
    expect((await apply(admin, `${role('fresh')}---\n${user}`)).plan.map((e) => `${e.kind}/${e.name}:${e.action}`)).toEqual(['role/fresh:create', 'user/carol:create']);
  });

  it('a token applied again with other roles keeps its use count', async () => {
    const token = (roles: string) => `kind: token\nversion: v2\nmetadata: {name: 0123456789abcdef0123456789abcdef}\nspec: {roles: [${roles}], uses: 5}\n`;
    await apply(admin, token('node'));
    const [key] = (await backend.range('/tokens/')).map((i) => i.key);
    const record = JSON.parse((await backend.get(key!))!.value) as Record<string, unknown>;
    await backend.put(key!, JSON.stringify({ ...record, used: 2 }));
    const result = await apply(admin, token('node, db'));
    expect(result.plan.map((e) => e.action)).toEqual(['update']);
    expect(JSON.parse((await backend.get(key!))!.value)).toMatchObject({ used: 2, roles: ['node', 'db'], expiresAt: record.expiresAt });
    // Applied again unchanged ten minutes later (its default lifetime is 30): its expiry is not pushed back.
    now += 600_000;
    expect((await apply(admin, token('node, db'))).plan.map((e) => e.action)).toEqual(['unchanged']);
  });

  it('a token past its expiry (its record kept a while) applied again without metadata.expires: renewed, not unchanged', async () => {
    const token = 'kind: token\nversion: v2\nmetadata: {name: fedcba9876543210fedcba9876543210}\nspec: {roles: [node], uses: 0}\n';
    await apply(admin, token);
    const [key] = (await backend.range('/tokens/')).map((i) => i.key);
    const first = JSON.parse((await backend.get(key!))!.value) as { expiresAt: number };
    now = first.expiresAt + 1000;
    expect(await backend.get(key!)).toBeDefined();
    expect((await apply(admin, token)).plan.map((e) => e.action)).toEqual(['update']);
    expect((JSON.parse((await backend.get(key!))!.value) as { expiresAt: number }).expiresAt).toBeGreaterThan(now);
  });
});

describe('unifiedDiff', () => {
  it('writes hunks with three lines of context and the line numbers of both sides', () => {
    const a = ['1', '2', '3', '4', '5', '6', '7', '8', '9', '10'].join('\n');
    const b = ['1', '2', '3', '4', 'five', '6', '7', '8', '9', '10', '11'].join('\n');
    expect(unifiedDiff(a, b, { before: 'a', after: 'b' })).toBe(
      ['--- a', '+++ b', '@@ -2,9 +2,10 @@', ' 2', ' 3', ' 4', '-5', '+five', ' 6', ' 7', ' 8', ' 9', ' 10', '+11', ''].join('\n'),
    );
    expect(unifiedDiff('same\n', 'same\n', { before: 'a', after: 'b' })).toBe('');
    expect(unifiedDiff('', 'new\n', { before: 'a', after: 'b' })).toBe('--- a\n+++ b\n@@ -0,0 +1,1 @@\n+new\n');
  });

  it('two texts of 5000 different lines each: a full replacement, without a 25-million-cell table', () => {
    const a = Array.from({ length: 5000 }, (_, i) => `a${i}`).join('\n');
    const b = Array.from({ length: 5000 }, (_, i) => `b${i}`).join('\n');
    const diff = unifiedDiff(a, b, { before: 'a', after: 'b' }).split('\n');
    expect(diff.filter((l) => l.startsWith('-a')).length).toBe(5000);
    expect(diff.filter((l) => l.startsWith('+b')).length).toBe(5000);
  });
});
