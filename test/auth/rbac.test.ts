import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PRESET_ROLES, allowedDatabaseAccess, allowedLogins, canAccess, checkAccess, databaseGrant, kubeGrant, kubeImpersonation, matchLabels, maxSessionTtlMs, type Role } from '../../src/auth/rbac.js';
import { codeOf } from '../helpers/errors.js';
import { grantAllows } from '../../src/tunnel/protocol.js';
import { RULE_RESOURCES, VERBS, parseManifest, type Labels, type RoleSpec, type Verb } from '../../src/auth/resources/index.js';

const role = (name: string, spec: RoleSpec): Role => ({ kind: 'role', version: 'v7', metadata: { name }, spec });
const preset = (name: string): Role => PRESET_ROLES.find((r) => r.metadata.name === name)!;

/** The role of the seed's "Role resource" table, read from YAML as gwctl create would. */
const [maintenanceAdmin] = parseManifest(
  `kind: role
version: v7
metadata:
  name: maintenance-admin
spec:
  allow:
    rules:
      - resources: [cluster_maintenance_config]
        verbs: [create, read, update, delete]
`,
  'role.yaml',
) as [Role];

const CONCRETE_VERBS = VERBS.filter((v) => v !== '*');

describe('checkAccess', () => {
  it('grants the seed role create, read, update and delete on cluster_maintenance_config, and nothing else', () => {
    for (const verb of ['create', 'read', 'update', 'delete'] as const) {
      expect(checkAccess([maintenanceAdmin], 'cluster_maintenance_config', verb)).toEqual({ allowed: true });
    }
    expect(checkAccess([maintenanceAdmin], 'cluster_maintenance_config', 'list').allowed).toBe(false);
    expect(checkAccess([maintenanceAdmin], 'role', 'read').allowed).toBe(false);
  });

  it('refuses with the roles consulted and the missing rule', () => {
    const decision = checkAccess([preset('access'), preset('editor')], 'cluster_maintenance_config', 'create');
    expect(decision).toEqual({
      allowed: false,
      reason: 'none of your roles (access, editor) allows "create" on "cluster_maintenance_config"',
      missing: { resources: ['cluster_maintenance_config'], verbs: ['create'] },
    });
  });

  it('refuses a user without roles', () => {
    const decision = checkAccess([], 'role', 'read');
    expect(decision.allowed).toBe(false);
    if (!decision.allowed) {
      expect(decision.reason).toContain('no roles');
      expect(decision.missing).toEqual({ resources: ['role'], verbs: ['read'] });
    }
  });

  it('lets deny win over allow, in any role, and names the denying role', () => {
    const locked = role('locked', { deny: { rules: [{ resources: ['role'], verbs: ['create'] }] } });
    const decision = checkAccess([preset('editor'), locked], 'role', 'create');
    expect(decision).toMatchObject({ allowed: false, reason: 'role "locked" denies "create" on "role"' });
    // Only what is denied: the editor still reads and updates roles.
    expect(checkAccess([preset('editor'), locked], 'role', 'update').allowed).toBe(true);
    // A deny in the same role as the allow.
    const both = role('both', { allow: { rules: [{ resources: ['*'], verbs: ['*'] }] }, deny: { rules: [{ resources: ['token'], verbs: ['*'] }] } });
    expect(checkAccess([both], 'token', 'list').allowed).toBe(false);
    expect(checkAccess([both], 'user', 'list').allowed).toBe(true);
  });

  it.each<[string, RoleSpec, string, Verb, boolean]>([
    ['* resources', { allow: { rules: [{ resources: ['*'], verbs: ['read'] }] } }, 'cluster_maintenance_config', 'read', true],
    ['* resources, other verb', { allow: { rules: [{ resources: ['*'], verbs: ['read'] }] } }, 'role', 'delete', false],
    ['* verbs', { allow: { rules: [{ resources: ['user'], verbs: ['*'] }] } }, 'user', 'delete', true],
    ['* verbs, other resource', { allow: { rules: [{ resources: ['user'], verbs: ['*'] }] } }, 'token', 'read', false],
    ['* and *', { allow: { rules: [{ resources: ['*'], verbs: ['*'] }] } }, 'event', 'list', true],
    ['rules spread over entries', { allow: { rules: [{ resources: ['role'], verbs: ['read'] }, { resources: ['user'], verbs: ['create'] }] } }, 'user', 'create', true],
    ['resource and verb from different rules do not combine', { allow: { rules: [{ resources: ['role'], verbs: ['read'] }, { resources: ['user'], verbs: ['create'] }] } }, 'role', 'create', false],
    ['deny * verbs', { allow: { rules: [{ resources: ['*'], verbs: ['*'] }] }, deny: { rules: [{ resources: ['cluster_maintenance_config'], verbs: ['*'] }] } }, 'cluster_maintenance_config', 'read', false],
    ['deny * resources', { allow: { rules: [{ resources: ['role'], verbs: ['*'] }] }, deny: { rules: [{ resources: ['*'], verbs: ['delete'] }] } }, 'role', 'delete', false],
    ['deny elsewhere', { allow: { rules: [{ resources: ['role'], verbs: ['*'] }] }, deny: { rules: [{ resources: ['user'], verbs: ['delete'] }] } }, 'role', 'delete', true],
    ['no rules at all', {}, 'role', 'read', false],
    ['a request for * needs a * rule', { allow: { rules: [{ resources: ['role'], verbs: ['list', 'read', 'create', 'update', 'delete'] }] } }, 'role', '*', false],
  ])('%s', (_, spec, resource, verb, allowed) => {
    expect(checkAccess([role('r', spec)], resource, verb).allowed).toBe(allowed);
  });

  it('deny always wins (property)', () => {
    const name = fc.constantFrom(...RULE_RESOURCES);
    const verb = fc.constantFrom(...VERBS);
    const rule = fc.record({ resources: fc.array(name, { minLength: 1, maxLength: 3 }), verbs: fc.array(verb, { minLength: 1, maxLength: 3 }) });
    const spec = fc.record({ allow: fc.record({ rules: fc.array(rule, { maxLength: 3 }) }), deny: fc.record({ rules: fc.array(rule, { maxLength: 2 }) }) });
    fc.assert(
      fc.property(fc.array(spec, { minLength: 1, maxLength: 3 }), fc.constantFrom(...RULE_RESOURCES.filter((r) => r !== '*')), fc.constantFrom(...CONCRETE_VERBS), (specs, resource, v) => {
        const roles = specs.map((s, i) => role(`r${i}`, s));
        const denied = specs.some((s) => s.deny.rules.some((r) => (r.resources.includes(resource) || r.resources.includes('*')) && (r.verbs.includes(v) || r.verbs.includes('*'))));
        const granted = specs.some((s) => s.allow.rules.some((r) => (r.resources.includes(resource) || r.resources.includes('*')) && (r.verbs.includes(v) || r.verbs.includes('*'))));
        expect(checkAccess(roles, resource, v).allowed).toBe(!denied && granted);
      }),
      { numRuns: 300 },
    );
  });
});

describe('preset roles', () => {
  it('are access, editor and auditor, valid role resources (they round-trip through a manifest)', () => {
    expect(PRESET_ROLES.map((r) => r.metadata.name)).toEqual(['access', 'editor', 'auditor']);
    for (const r of PRESET_ROLES) {
      const yaml = `kind: role\nversion: v7\nmetadata: ${JSON.stringify(r.metadata)}\nspec: ${JSON.stringify(r.spec)}\n`;
      expect(parseManifest(yaml, `${r.metadata.name}.yaml`)).toEqual([r]);
    }
  });

  it('none grants any verb on cluster_maintenance_config (the seed: a role must be created for it)', () => {
    for (const verb of VERBS) {
      expect(checkAccess(PRESET_ROLES, 'cluster_maintenance_config', verb).allowed).toBe(false);
      for (const r of PRESET_ROLES) expect(checkAccess([r], 'cluster_maintenance_config', verb).allowed).toBe(false);
    }
    // Not through a wildcard either.
    for (const r of PRESET_ROLES) for (const rule of r.spec.allow?.rules ?? []) expect(rule.resources).not.toContain('*');
  });

  it('access: every labelled resource, logins from the traits, no admin rules', () => {
    const access = preset('access');
    for (const kind of ['node', 'db', 'app', 'kube_cluster', 'windows_desktop'] as const) {
      expect(canAccess([access], kind, {})).toBe(true);
      expect(canAccess([access], kind, { env: 'prod' })).toBe(true);
    }
    expect(allowedLogins([access], { logins: ['ubuntu', 'alice'] })).toEqual(['alice', 'ubuntu']);
    expect(allowedLogins([access], {})).toEqual([]);
    expect(allowedDatabaseAccess([access], { db_users: ['reader'], db_names: ['shop'] })).toEqual({ names: ['shop'], users: ['reader'] });
  });

  it('kubeGrant: kubernetes_users and kubernetes_groups of every role, templates from traits, a deny removes a value', () => {
    const access = preset('access');
    expect(kubeGrant([access], { kubernetes_groups: ['viewers'], kubernetes_users: ['alice@corp'] })).toEqual({ users: ['alice@corp'], groups: ['viewers'] });
    expect(kubeGrant([access], {})).toEqual({ users: [], groups: [] });
    const ops = role('ops', { allow: { kubernetes_groups: ['system:masters', 'viewers'] }, deny: { kubernetes_groups: ['system:masters'] } });
    expect(kubeGrant([ops], {}).groups).toEqual(['viewers']);
  });

  it('kubeImpersonation: the one allowed user or the gateway user, the allowed groups; --as picks among them only', async () => {
    expect(kubeImpersonation({ users: [], groups: ['viewers'] }, 'alice', {})).toEqual({ user: 'alice', groups: ['viewers'] });
    expect(kubeImpersonation({ users: ['sre'], groups: [] }, 'alice', {})).toEqual({ user: 'sre', groups: [] });
    expect(kubeImpersonation({ users: ['a', 'b'], groups: ['g', 'h'] }, 'alice', { user: 'b', groups: ['h'] })).toEqual({ user: 'b', groups: ['h'] });
    // Hostile: nothing allowed, a user or group the roles do not allow, several users and no choice.
    expect(await codeOf(() => kubeImpersonation({ users: [], groups: [] }, 'alice', {}))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    expect(await codeOf(() => kubeImpersonation(undefined, 'alice', {}))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    expect(await codeOf(() => kubeImpersonation({ users: [], groups: ['viewers'] }, 'alice', { user: 'admin' }))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    expect(await codeOf(() => kubeImpersonation({ users: [], groups: ['viewers'] }, 'alice', { groups: ['system:masters'] }))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    expect(await codeOf(() => kubeImpersonation({ users: ['a', 'b'], groups: [] }, 'alice', {}))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
  });

  it('databaseGrant: templates expanded, denies kept apart (a deny beats an allowed *), a trait "*" grants nothing', () => {
    const access = PRESET_ROLES.find((r) => r.metadata.name === 'access')!;
    expect(databaseGrant([access], { db_users: ['reader', '*'], db_names: ['shop'] })).toEqual({ users: { allow: ['reader'], deny: [] }, names: { allow: ['shop'], deny: [] } });
    expect(databaseGrant([access], {})).toEqual({ users: { allow: [], deny: [] }, names: { allow: [], deny: [] } });
    const any = role('any', { allow: { db_users: ['*'], db_names: ['*'] }, deny: { db_users: ['postgres', '{{external.banned}}'] } });
    const grant = databaseGrant([any], { banned: ['root'] });
    expect(grant.users).toEqual({ allow: ['*'], deny: ['postgres', 'root'] });
    expect(grantAllows(grant.users, 'orders_app')).toBe(true);
    expect(grantAllows(grant.users, 'postgres')).toBe(false);
    expect(grantAllows(grant.users, 'root')).toBe(false);
    expect(grantAllows(databaseGrant([access], { db_users: ['*'] }).users, 'postgres')).toBe(false);
    expect(grantAllows({ allow: ['a*'], deny: [] }, 'ab')).toBe(false); // only a whole "*" is a wildcard
    for (const resource of RULE_RESOURCES) for (const verb of VERBS) expect(checkAccess([access], resource, verb).allowed).toBe(false);
  });

  it('editor: every verb on users, roles, tokens, connectors, locks and the inventory; reads events', () => {
    const editor = preset('editor');
    for (const resource of ['role', 'user', 'token', 'github', 'saml', 'oidc', 'node', 'db', 'app', 'kube_cluster', 'windows_desktop', 'lock']) {
      for (const verb of CONCRETE_VERBS) expect(checkAccess([editor], resource, verb)).toEqual({ allowed: true });
    }
    expect(checkAccess([editor], 'event', 'list').allowed).toBe(true);
    expect(checkAccess([editor], 'event', 'read').allowed).toBe(true);
    expect(checkAccess([editor], 'event', 'delete').allowed).toBe(false);
    expect(canAccess([editor], 'node', { env: 'dev' })).toBe(false);
    expect(allowedLogins([editor], { logins: ['root'] })).toEqual([]);
  });

  it('auditor: lists and reads events, nothing else', () => {
    const auditor = preset('auditor');
    expect(checkAccess([auditor], 'event', 'list').allowed).toBe(true);
    expect(checkAccess([auditor], 'event', 'read').allowed).toBe(true);
    for (const verb of ['create', 'update', 'delete'] as const) expect(checkAccess([auditor], 'event', verb).allowed).toBe(false);
    for (const resource of RULE_RESOURCES.filter((r) => r !== 'event' && r !== '*')) {
      for (const verb of VERBS) expect(checkAccess([auditor], resource, verb).allowed).toBe(false);
    }
  });

  it('cannot be changed by a caller', () => {
    expect(Object.isFrozen(PRESET_ROLES)).toBe(true);
    expect(() => {
      (preset('editor').spec.allow!.rules![0]!.resources as string[]).push('cluster_maintenance_config');
    }).toThrow(TypeError);
    expect(checkAccess(PRESET_ROLES, 'cluster_maintenance_config', 'create').allowed).toBe(false);
  });
});

describe('matchLabels', () => {
  it.each<[string, Labels | undefined, Record<string, string>, boolean]>([
    ["'*': '*' matches labels", { '*': '*' }, { env: 'prod' }, true],
    ["'*': '*' matches no labels", { '*': '*' }, {}, true],
    ["'*': ['*'] is the same", { '*': ['*'] }, {}, true],
    ["'*' with another value matches nothing", { '*': 'prod' }, { env: 'prod' }, false],
    ['exact value', { env: 'prod' }, { env: 'prod', team: 'x' }, true],
    ['other value', { env: 'prod' }, { env: 'dev' }, false],
    ['missing label', { env: 'prod' }, { team: 'x' }, false],
    ['every key must match', { env: 'prod', team: 'db' }, { env: 'prod', team: 'web' }, false],
    ['every key matches', { env: 'prod', team: 'db' }, { env: 'prod', team: 'db' }, true],
    ['value *: any value, but the label must exist', { env: '*' }, { env: 'anything' }, true],
    ['value * and no label', { env: '*' }, {}, false],
    ['glob', { env: 'prod-*' }, { env: 'prod-eu' }, true],
    ['glob is anchored', { env: 'prod-*' }, { env: 'xprod-eu' }, false],
    ['glob in the middle', { host: 'db-*.example.com' }, { host: 'db-1.example.com' }, true],
    ['glob metacharacters are literal', { host: 'a.b*' }, { host: 'axb1' }, false],
    ['list of values: any', { env: ['dev', 'staging'] }, { env: 'staging' }, true],
    ['list of values: none', { env: ['dev', 'staging'] }, { env: 'prod' }, false],
    ['regular expression', { region: '^eu-(west|north)-[0-9]$' }, { region: 'eu-north-1' }, true],
    ['regular expression, no match', { region: '^eu-(west|north)-[0-9]$' }, { region: 'us-east-1' }, false],
    ['case-sensitive', { env: 'prod' }, { env: 'Prod' }, false],
    ['an empty selector matches nothing', {}, { env: 'prod' }, false],
    ['an absent selector matches nothing', undefined, {}, false],
    ['inherited names are not labels', { constructor: '*' }, {}, false],
  ])('%s', (_, selector, labels, matches) => {
    expect(matchLabels(selector, labels)).toBe(matches);
  });
});

describe('canAccess', () => {
  const dev = role('dev', { allow: { node_labels: { env: ['dev', 'staging'] }, db_labels: { '*': '*' } } });
  const noProd = role('no-prod', { deny: { node_labels: { env: 'prod' }, db_labels: { env: 'prod' } } });
  const everything = role('everything', { allow: { node_labels: { '*': '*' }, db_labels: { '*': '*' } } });

  it('allows what a role selects', () => {
    expect(canAccess([dev], 'node', { env: 'dev' })).toBe(true);
    expect(canAccess([dev], 'node', { env: 'prod' })).toBe(false);
    expect(canAccess([dev], 'db', {})).toBe(true);
  });

  it('uses the label field of the kind', () => {
    expect(canAccess([dev], 'app', { env: 'dev' })).toBe(false);
    const kube = role('kube', { allow: { kubernetes_labels: { env: 'dev' }, windows_desktop_labels: { os: 'win*' } } });
    expect(canAccess([kube], 'kube_cluster', { env: 'dev' })).toBe(true);
    expect(canAccess([kube], 'windows_desktop', { os: 'windows-2022' })).toBe(true);
    expect(canAccess([kube], 'node', { env: 'dev' })).toBe(false);
  });

  it('lets deny win, across roles', () => {
    expect(canAccess([everything, noProd], 'node', { env: 'prod' })).toBe(false);
    expect(canAccess([everything, noProd], 'node', { env: 'dev' })).toBe(true);
    expect(canAccess([everything, noProd], 'node', {})).toBe(true);
    expect(canAccess([everything, role('nothing', { deny: { db_labels: { '*': '*' } } })], 'db', {})).toBe(false);
  });

  it('an empty deny selector denies nothing', () => {
    expect(canAccess([everything, role('empty', { deny: { node_labels: {} } })], 'node', { env: 'x' })).toBe(true);
  });
});

describe('allowedLogins', () => {
  it('expands templates from traits, removes denied logins, sorts and dedupes', () => {
    const a = role('a', { allow: { logins: ['{{internal.logins}}', 'ubuntu', 'deploy'] } });
    const b = role('b', { allow: { logins: ['ubuntu', 'admin-{{external.username}}'] }, deny: { logins: ['root', '{{internal.banned}}'] } });
    expect(allowedLogins([a, b], { logins: ['root', 'alice', 'ubuntu'], username: ['alice'], banned: ['deploy'] })).toEqual(['admin-alice', 'alice', 'ubuntu']);
  });

  it('gives nothing for a missing trait, and drops unusable trait values', () => {
    const a = role('a', { allow: { logins: ['{{internal.logins}}', '{{ internal.other }}'] } });
    expect(allowedLogins([a], {})).toEqual([]);
    expect(allowedLogins([a], { logins: ['ok', 'two words', '', 'new\nline', '{{internal.x}}'], other: ['fine'] })).toEqual(['fine', 'ok']);
  });

  it('reads only own traits', () => {
    const a = role('a', { allow: { logins: ['{{internal.constructor}}', '{{internal.__proto__}}'] } });
    expect(allowedLogins([a], {})).toEqual([]);
  });

  it('works on a role read from a manifest', () => {
    const [r] = parseManifest(
      "kind: role\nversion: v7\nmetadata: {name: r}\nspec:\n  allow:\n    logins: ['{{internal.logins}}', ec2-user]\n  deny:\n    logins: [root]\n",
      'r.yaml',
    ) as [Role];
    expect(allowedLogins([r], { logins: ['root', 'bob'] })).toEqual(['bob', 'ec2-user']);
  });
});

describe('maxSessionTtlMs', () => {
  it('is the shortest max_session_ttl among the roles, undefined when none sets one', () => {
    const [short, longer] = parseManifest(
      'kind: role\nversion: v7\nmetadata: {name: short}\nspec: {options: {max_session_ttl: 1.5h}}\n---\nkind: role\nversion: v7\nmetadata: {name: longer}\nspec: {options: {max_session_ttl: 8h}}\n',
      'r.yaml',
    ) as [Role, Role];
    expect(maxSessionTtlMs([preset('access'), longer, short])).toBe(90 * 60_000);
    expect(maxSessionTtlMs([longer])).toBe(8 * 3600_000);
    expect(maxSessionTtlMs([preset('access'), preset('editor')])).toBeUndefined();
    expect(maxSessionTtlMs([])).toBeUndefined();
  });
});
