/**
 * Revocation at unit level: locks (user, role, agent; expiry; unlock), removed users and agents, and the
 * registry of open sessions that a lock or a deletion closes through the Backend's watch. A real SQLite backend
 * in memory and an injected clock.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { openSqliteBackend } from '../../src/backend/index.js';
import { generateKeyPair, type Identity } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { parseManifest, toYaml } from '../../src/auth/resources/index.js';
import { GatewayError } from '../../src/errors.js';
import { codeOf } from '../helpers/errors.js';

let now = Date.parse('2026-11-21T10:00:00Z');
const clock = () => now;
let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
let admin: Identity;
const keys = generateKeyPair();
const PASSWORD = 'correct horse battery';

async function errorOf(p: Promise<unknown>): Promise<GatewayError | undefined> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  return undefined;
}

const user = (name: string, roles: string[]): Identity => ({ kind: 'user', name, cluster: 'unit.example', roles });
const login = (username: string) => auth.login({ username, password: PASSWORD, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '10.0.0.1' });

beforeEach(async () => {
  now = Date.parse('2026-11-21T10:00:00Z');
  backend = openSqliteBackend({ path: ':memory:', clock, sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'unit.example', clock });
  admin = auth.adminIdentity();
  await auth.addUser(admin, 'bob', ['editor', 'access'], PASSWORD);
  await auth.addUser(admin, 'alice', ['access'], PASSWORD);
});

afterEach(async () => {
  await backend.close();
});

describe('locks', () => {
  it('a user lock refuses every API call and login with a code that names the lock; unlock restores', async () => {
    const bob = user('bob', ['editor']);
    const lock = await auth.createLock(admin, { target: { user: 'bob' }, message: 'offboarding' });
    const refused = await errorOf(auth.addToken(bob, { roles: ['node'] }));
    expect(refused?.code).toBe('GW_ERR_ACCESS_LOCKED');
    expect(refused?.message).toContain(lock.metadata.name);
    expect(refused?.message).toContain('offboarding');
    expect(refused?.details).toMatchObject({ lock: lock.metadata.name, target: { user: 'bob' } });
    expect(await codeOf(auth.resolveCaller(bob))).toBe('GW_ERR_ACCESS_LOCKED');
    expect(await codeOf(login('bob'))).toBe('GW_ERR_ACCESS_LOCKED');
    // alice is not concerned.
    await expect(login('alice')).resolves.toBeDefined();
    expect(await auth.removeLocks(admin, { target: { user: 'bob' } })).toEqual([lock.metadata.name]);
    await expect(auth.addToken(bob, { roles: ['node'] })).resolves.toBeDefined();
    await expect(login('bob')).resolves.toBeDefined();
  });

  it('a role lock refuses every user holding the role, in the certificate or in the stored user', async () => {
    await auth.createLock(admin, { target: { role: 'editor' }, name: 'no-editors' });
    expect(await codeOf(auth.listUsers(user('bob', ['editor'])))).toBe('GW_ERR_ACCESS_LOCKED');
    // bob's certificate names only access, but he holds editor now: still locked.
    expect(await codeOf(auth.inventory(user('bob', ['access']), 'node'))).toBe('GW_ERR_ACCESS_LOCKED');
    await expect(auth.inventory(user('alice', ['access']), 'node')).resolves.toEqual([]);
    await auth.removeLocks(admin, { name: 'no-editors' });
    await expect(auth.listUsers(user('bob', ['editor']))).resolves.toHaveLength(2);
  });

  it('an agent lock refuses the host identity; an agent that was never there is revoked', async () => {
    const { token } = await auth.addToken(admin, { roles: ['node'] });
    const joined = await auth.join({ token, roles: ['node'], nodename: 'n1', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '10.0.0.9' });
    const host: Identity = { kind: 'host', name: joined.hostId, cluster: 'unit.example', roles: ['node'] };
    await expect(auth.maintenanceForAgent(host)).resolves.toBeUndefined();
    await auth.createLock(admin, { target: { node: joined.hostId } });
    expect(await codeOf(auth.maintenanceForAgent(host))).toBe('GW_ERR_ACCESS_LOCKED');
    expect(await codeOf(auth.resolveCaller({ ...host, name: '00000000-0000-4000-8000-000000000000' }))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
  });

  it('a lock with an expiry ends by itself', async () => {
    const lock = await auth.createLock(admin, { target: { user: 'bob' }, ttlMs: 60_000 });
    expect(lock.spec.expires).toBe(new Date(now + 60_000).toISOString());
    expect(await codeOf(auth.resolveCaller(user('bob', ['editor'])))).toBe('GW_ERR_ACCESS_LOCKED');
    now += 60_001;
    await expect(auth.resolveCaller(user('bob', ['editor']))).resolves.toMatchObject({ name: 'bob' });
    expect(await auth.getResources(admin, 'locks', undefined, false)).toEqual([]);
  });

  it('locks are resources: listed with get locks, created from a manifest, removed with rm; needs the lock rule', async () => {
    const manifest = parseManifest('kind: lock\nversion: v2\nmetadata: {name: freeze}\nspec:\n  target: {role: access}\n  message: maintenance\n  expires: "2030-01-01T00:00:00Z"\n', 'lock.yaml');
    expect(await auth.createResources(admin, manifest, false)).toEqual(['lock "freeze" has been created']);
    const listed = await auth.getResources(admin, 'locks', undefined, false);
    expect(listed).toEqual([expect.objectContaining({ kind: 'lock', metadata: { name: 'freeze' }, spec: expect.objectContaining({ target: { role: 'access' }, created_by: 'admin' }) })]);
    // What gwctl get prints reads back with gwctl create -f.
    expect(parseManifest(toYaml(listed), 'get.yaml')).toEqual(listed);
    expect(await codeOf(auth.getResources(user('alice', ['access']), 'lock', undefined, false))).toBe('GW_ERR_ACCESS_LOCKED');
    await auth.removeResource(admin, 'lock', 'freeze');
    expect(await codeOf(auth.createLock(user('alice', ['access']), { target: { user: 'bob' } }))).toBe('GW_ERR_ACCESS_DENIED');
    // The preset editor may manage locks.
    await expect(auth.createLock(user('bob', ['editor']), { target: { user: 'alice' } })).resolves.toBeDefined();
  });

  it('refuses a lock without exactly one target, or one that expired already', async () => {
    expect(await codeOf(auth.createLock(admin, { target: {} }))).toBe('GW_ERR_RESOURCE_INVALID');
    expect(await codeOf(auth.createLock(admin, { target: { user: 'bob', role: 'editor' } }))).toBe('GW_ERR_RESOURCE_INVALID');
    expect(await codeOf(auth.createLock(admin, { target: { user: 'bob' }, expiresAt: now - 1 }))).toBe('GW_ERR_RESOURCE_INVALID');
    expect(await codeOf(auth.removeLocks(admin, { target: { user: 'bob' } }))).toBe('GW_ERR_RESOURCE_NOT_FOUND');
    const twoTargets = () => parseManifest('kind: lock\nversion: v2\nmetadata: {name: x}\nspec:\n  target: {user: a, role: b}\n', 'l.yaml');
    expect(twoTargets).toThrow(expect.objectContaining({ code: 'GW_ERR_RESOURCE_INVALID' }));
    const metaExpiry = () => parseManifest('kind: lock\nversion: v2\nmetadata: {name: x, expires: "2030-01-01T00:00:00Z"}\nspec:\n  target: {user: a}\n', 'l.yaml');
    expect(metaExpiry).toThrow(expect.objectContaining({ code: 'GW_ERR_RESOURCE_INVALID' }));
  });
});

describe('a user removed and created again under the same name', () => {
  it('refuses the certificates issued before the new user existed, and accepts new ones', async () => {
    const old: Identity = { ...user('bob', ['editor']), issuedAt: now };
    await expect(auth.resolveCaller(old)).resolves.toBeDefined();
    await auth.removeUser(admin, 'bob');
    now += 10_000;
    await auth.addUser(admin, 'bob', ['editor'], PASSWORD);
    expect(await codeOf(auth.addToken(old, { roles: ['node'] }))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
    expect(await codeOf(auth.resolveSshUser('bob', old.issuedAt))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
    await expect(auth.addToken({ ...old, issuedAt: now }, { roles: ['node'] })).resolves.toBeDefined();
  });
});

describe('roles and logins come from the stored user, intersected with the certificate', () => {
  it('logins the current roles no longer allow are dropped', async () => {
    await auth.addUser(admin, 'carol', ['access'], PASSWORD, ['carol', 'root']);
    const cert: Identity = { ...user('carol', ['access']), logins: ['carol', 'root'] };
    expect((await auth.resolveCaller(cert)).logins).toEqual(['carol', 'root']);
    await auth.setUserRoles(admin, 'carol', ['auditor']);
    expect(await auth.resolveCaller(cert)).toMatchObject({ roles: [], logins: [] });
  });
});

describe('database users and names come from the roles held now and the stored traits', () => {
  it('the grant follows the current roles; a trait value that is not a name (a "*", a space, a brace) is refused at creation', async () => {
    await auth.addUser(admin, 'dora', ['access'], PASSWORD, [], { db_users: ['orders_app'], db_names: ['orders'] });
    const cert = user('dora', ['access']);
    expect((await auth.resolveCaller(cert)).db).toEqual({ users: { allow: ['orders_app'], deny: [] }, names: { allow: ['orders'], deny: [] } });
    await auth.setUserRoles(admin, 'dora', ['auditor']);
    expect((await auth.resolveCaller(cert)).db).toEqual({ users: { allow: [], deny: [] }, names: { allow: [], deny: [] } });
    for (const bad of ['*', 'a b', '{{internal.x}}', 'x'.repeat(254), '']) {
      expect(await codeOf(auth.addUser(admin, `eve${bad.length}`, ['access'], PASSWORD, [], { db_users: [bad] })), JSON.stringify(bad).slice(0, 20)).toBe('GW_ERR_RESOURCE_INVALID');
    }
  });
});

describe('Kubernetes users and groups come from the roles held now and the stored traits', () => {
  it('the access role reads the kubernetes_users / kubernetes_groups traits; a "*" or a space is refused at creation', async () => {
    await auth.addUser(admin, 'kim', ['access'], PASSWORD, [], { kubernetes_groups: ['viewers'], kubernetes_users: ['kim@corp'] });
    const cert = user('kim', ['access']);
    expect((await auth.resolveCaller(cert)).kube).toEqual({ users: ['kim@corp'], groups: ['viewers'] });
    await auth.setUserRoles(admin, 'kim', ['auditor']);
    expect((await auth.resolveCaller(cert)).kube).toEqual({ users: [], groups: [] });
    for (const bad of ['*', 'system masters']) {
      expect(await codeOf(auth.addUser(admin, `kk${bad.length}`, ['access'], PASSWORD, [], { kubernetes_groups: [bad] }))).toBe('GW_ERR_RESOURCE_INVALID');
    }
  });
});

describe('open sessions are closed on lock and deletion', () => {
  function track(identity: Identity) {
    const close = vi.fn();
    auth.sessions.track(identity, 'test stream', close);
    return close;
  }

  it('a user lock closes that user’s sessions (and not others); a role lock closes its holders’', async () => {
    const bobClose = track(user('bob', ['access']));
    const aliceClose = track(user('alice', ['access']));
    await auth.createLock(admin, { target: { user: 'bob' } });
    await vi.waitFor(() => expect(bobClose).toHaveBeenCalledWith(expect.objectContaining({ code: 'GW_ERR_ACCESS_LOCKED' })));
    expect(aliceClose).not.toHaveBeenCalled();
    await auth.createLock(admin, { target: { role: 'access' } });
    await vi.waitFor(() => expect(aliceClose).toHaveBeenCalledTimes(1));
    expect(bobClose).toHaveBeenCalledTimes(1);
    expect(auth.sessions.count()).toBe(0);
  });

  it('removing a user closes what it has open', async () => {
    const close = track(user('bob', ['editor']));
    await auth.removeUser(admin, 'bob');
    await vi.waitFor(() => expect(close).toHaveBeenCalledWith(expect.objectContaining({ code: 'GW_ERR_AUTH_IDENTITY_REVOKED' })));
  });

  it('an agent lock closes its tunnel; a lock on another agent does not', async () => {
    const { token } = await auth.addToken(admin, { roles: ['node'], uses: 2 });
    const j = (n: string) => auth.join({ token, roles: ['node'], nodename: n, publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '10.0.0.9' });
    const [a, b] = [await j('a'), await j('b')];
    const host = (id: string): Identity => ({ kind: 'host', name: id, cluster: 'unit.example', roles: ['node'] });
    const closeA = track(host(a.hostId));
    const closeB = track(host(b.hostId));
    await auth.createLock(admin, { target: { node: a.hostId } });
    await vi.waitFor(() => expect(closeA).toHaveBeenCalledTimes(1));
    expect(closeB).not.toHaveBeenCalled();
  });

  it('an untracked session is left alone; an unrelated write closes nothing', async () => {
    const close = vi.fn();
    const untrack = auth.sessions.track(user('bob', ['editor']), 'ended', close);
    untrack();
    const stays = track(user('alice', ['access']));
    await auth.createLock(admin, { target: { user: 'bob' } });
    await auth.setUserRoles(admin, 'alice', ['access', 'auditor']);
    await new Promise((r) => setTimeout(r, 50));
    expect(close).not.toHaveBeenCalled();
    expect(stays).not.toHaveBeenCalled();
  });
});

describe('inventory kinds', () => {
  it('names of Object.prototype members are unknown kinds, not an empty inventory', async () => {
    for (const kind of ['constructor', '__proto__', 'toString', 'hasOwnProperty']) {
      expect(await codeOf(auth.inventory(admin, kind)), kind).toBe('GW_ERR_RESOURCE_KIND');
    }
    await expect(auth.inventory(admin, 'nodes')).resolves.toEqual([]);
  });
});
