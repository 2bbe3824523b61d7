import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import {
  RESOURCE_KINDS,
  WEEKDAYS,
  durationMs,
  githubRoles,
  oidcRoles,
  parseManifest,
  samlRoles,
  toJson,
  toYaml,
  tokenId,
  withoutSecrets,
  type AnyResource,
  type ClusterMaintenanceConfig,
  type GithubConnector,
  type ManifestProblem,
  type OidcConnector,
  type RoleResource,
  type SamlConnector,
  type TokenResource,
} from '../../src/auth/resources/index.js';
import { GatewayError, type ErrorCode } from '../../src/errors.js';

/** The GatewayError parseManifest throws for text (fails the test when it does not throw one). */
function failure(text: string, source = 'manifest.yaml'): GatewayError {
  try {
    parseManifest(text, source);
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error(`parseManifest accepted:\n${text}`);
}

const problemsOf = (err: GatewayError): ManifestProblem[] => err.details.problems as ManifestProblem[];

const CERT = '-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\n-----END CERTIFICATE-----\n';
const KEY = '-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgE\n-----END PRIVATE KEY-----\n';
const indent = (s: string, n: number): string => s.trimEnd().split('\n').map((l) => ' '.repeat(n) + l).join('\n');

// --- valid manifests, one per kind -------------------------------------------------------------------------------

/** The role the seed's "Role resource" table describes: manages cluster_maintenance_config. */
const SEED_ROLE = `kind: role
version: v7
metadata:
  name: maintenance-admin
spec:
  allow:
    rules:
      - resources: [cluster_maintenance_config]
        verbs: [create, read, update, delete]
`;

const ROLE = `kind: role
version: v7
metadata:
  name: dev
  description: Developers
  labels: {team: platform}
spec:
  allow:
    logins: ['{{internal.logins}}', ubuntu, 'admin-{{external.username}}']
    node_labels:
      env: [dev, 'staging-*']
      'region': '^eu-(west|north)-[0-9]$'
    db_labels: {'*': '*'}
    app_labels: {team: platform}
    kubernetes_labels: {env: dev}
    windows_desktop_labels: {'*': ['*']}
    db_names: ['{{internal.db_names}}', analytics]
    db_users: [readonly]
    rules:
      - resources: [node, db, event]
        verbs: [list, read]
  deny:
    logins: [root]
    node_labels: {env: prod}
    rules:
      - resources: ['*']
        verbs: [delete]
  options:
    max_session_ttl: 8h30m
`;

const USER = `kind: user
version: v2
metadata:
  name: alice@example.com
spec:
  roles: [access, dev]
  traits:
    logins: [alice, ubuntu]
    db_users: [alice]
`;

const TOKEN = `kind: token
version: v2
metadata:
  name: 8a3f5c1e9b7d4f2a6c0e8b1d3f5a7c9e
  expires: "2030-01-31T23:59:59Z"
spec:
  roles: [node, db]
  uses: 0
`;

const GITHUB = `kind: github
version: v3
metadata:
  name: github
spec:
  client_id: Iv1.0123456789abcdef
  client_secret: gh-secret-value
  redirect_url: https://gateway.example.com/v1/webapi/github/callback
  display: GitHub
  teams_to_roles:
    - organization: octocats
      team: admins
      roles: [editor, access]
    - organization: octocats
      team: '*'
      roles: [access]
  signing_key_pair:
    cert: |
${indent(CERT, 6)}
    private_key: |
${indent(KEY, 6)}
`;

const SAML = `kind: saml
version: v2
metadata:
  name: okta-saml
spec:
  acs: https://gateway.example.com/v1/webapi/saml/acs/okta-saml
  entity_descriptor_url: https://example.okta.com/app/abc/sso/saml/metadata
  display: Okta
  attributes_to_roles:
    - name: groups
      value: gateway-admins
      roles: [editor]
    - name: groups
      value: '^dev-.*$'
      roles: [access, dev]
  signing_key_pair:
    cert: |
${indent(CERT, 6)}
    private_key: |
${indent(KEY, 6)}
`;

const OIDC = `kind: oidc
version: v3
metadata:
  name: google
spec:
  issuer_url: https://accounts.google.com
  client_id: 1234.apps.googleusercontent.com
  client_secret: oidc-secret-value
  redirect_url: https://gateway.example.com/v1/webapi/oidc/callback
  claims_to_roles:
    - claim: groups
      value: admins@example.com
      roles: [editor]
    - name: hd
      value: 'example.*'
      roles: [access]
`;

const MAINTENANCE = `kind: cluster_maintenance_config
spec:
  agent_upgrades:
    utc_start_hour: 2
    weekdays: [ Mon, Wed, Fri ]
`;

const VALID: Array<[string, string]> = [
  ['role (the seed example)', SEED_ROLE],
  ['role (every field)', ROLE],
  ['user', USER],
  ['token', TOKEN],
  ['github', GITHUB],
  ['saml', SAML],
  ['oidc', OIDC],
  ['cluster_maintenance_config', MAINTENANCE],
];

describe('parseManifest: valid manifests', () => {
  it.each(VALID)('%s parses and round-trips through toYaml', (_, text) => {
    const first = parseManifest(text, 'in.yaml');
    expect(first).toHaveLength(1);
    const again = parseManifest(toYaml(first), 'out.yaml');
    expect(again).toEqual(first);
    expect(JSON.parse(toJson(first))).toEqual(first);
  });

  it('reads every kind from one stream, skipping empty documents, and round-trips it', () => {
    const text = `---\n${VALID.map(([, t]) => t).join('---\n')}---\n# nothing here\n---\n`;
    const resources = parseManifest(text, 'all.yaml');
    expect(resources.map((r) => r.kind)).toEqual(['role', 'role', 'user', 'token', 'github', 'saml', 'oidc', 'cluster_maintenance_config']);
    const yaml = toYaml(resources);
    expect(yaml.split(/^---$/m)).toHaveLength(resources.length);
    expect(parseManifest(yaml, 'out.yaml')).toEqual(resources);
  });

  it('returns [] for an empty manifest', () => {
    expect(parseManifest('', 'empty.yaml')).toEqual([]);
    expect(parseManifest('# only a comment\n---\n---\n', 'empty.yaml')).toEqual([]);
    expect(toYaml([])).toBe('');
  });

  it('gives the seed role its rule, verbatim', () => {
    const [role] = parseManifest(SEED_ROLE, 'role.yaml') as [RoleResource];
    expect(role).toEqual({
      kind: 'role',
      version: 'v7',
      metadata: { name: 'maintenance-admin' },
      spec: { allow: { rules: [{ resources: ['cluster_maintenance_config'], verbs: ['create', 'read', 'update', 'delete'] }] } },
    });
  });

  it('leaves unwritten optional fields out, and defaults the maintenance config name and version', () => {
    const [role] = parseManifest('kind: role\nversion: v7\nmetadata: {name: empty}\n', 'r.yaml') as [RoleResource];
    expect(role).toEqual({ kind: 'role', version: 'v7', metadata: { name: 'empty' }, spec: {} });
    const [user] = parseManifest('kind: user\nversion: v2\nmetadata: {name: bob}\n', 'u.yaml');
    expect(user).toEqual({ kind: 'user', version: 'v2', metadata: { name: 'bob' }, spec: { roles: [] } });
    const [cmc] = parseManifest(MAINTENANCE, 'm.yaml') as [ClusterMaintenanceConfig];
    expect(cmc.version).toBe('v1');
    expect(cmc.metadata).toEqual({ name: 'cluster-maintenance-config' });
  });

  it('reads back an SSO user as gwctl get prints it (created_by), and refuses a created_by of an unknown kind', () => {
    const text = 'kind: user\nversion: v2\nmetadata: {name: ada@example.com}\nspec:\n  roles: [access]\n  created_by: {connector: okta, kind: oidc, time: "2026-11-24T23:00:00.000Z"}\n';
    const [user] = parseManifest(text, 'u.yaml');
    expect(user).toMatchObject({ spec: { roles: ['access'], created_by: { connector: 'okta', kind: 'oidc' } } });
    expect(() => parseManifest(text.replace('kind: oidc', 'kind: ldap'), 'u.yaml')).toThrow(/created_by\.kind/);
  });

  it('lowercases verbs and resource names, keeps labels and regexes as written', () => {
    const [role] = parseManifest(
      'kind: role\nversion: v7\nmetadata: {name: r}\nspec:\n  allow:\n    rules: [{resources: [Role, CLUSTER_MAINTENANCE_CONFIG], verbs: [Read, "*"]}]\n',
      'r.yaml',
    ) as [RoleResource];
    expect(role.spec.allow?.rules).toEqual([{ resources: ['role', 'cluster_maintenance_config'], verbs: ['read', '*'] }]);
    const [dev] = parseManifest(ROLE, 'r.yaml') as [RoleResource];
    expect(dev.spec.allow?.node_labels).toEqual({ env: ['dev', 'staging-*'], region: '^eu-(west|north)-[0-9]$' });
  });

  it('accepts both spellings of the OIDC claim key and stores the canonical `claim`', () => {
    const [oidc] = parseManifest(OIDC, 'o.yaml') as [OidcConnector];
    expect(oidc.spec.claims_to_roles).toEqual([
      { claim: 'groups', value: 'admins@example.com', roles: ['editor'] },
      { claim: 'hd', value: 'example.*', roles: ['access'] },
    ]);
    expect(toYaml([oidc])).not.toMatch(/^\s+- name:/m);
  });

  it('quotes strings that other YAML readers would not read as strings', () => {
    const text = role("  allow:\n    node_labels: {enabled: 'yes', 'on': '0755', since: '2030-01-01'}\n");
    const yaml = toYaml(parseManifest(text, 'r.yaml'));
    expect(yaml).toContain('enabled: "yes"');
    expect(yaml).toContain('"on": "0755"');
    expect(yaml).toContain('since: "2030-01-01"');
    expect(parseManifest(yaml, 'again.yaml')).toEqual(parseManifest(text, 'r.yaml'));
  });

  it('keeps a label named __proto__ as a plain label', () => {
    const [r] = parseManifest(role("  allow:\n    node_labels: {__proto__: 'x'}\n"), 'r.yaml') as [RoleResource];
    const labels = r.spec.allow!.node_labels!;
    expect(Object.getPrototypeOf(labels)).toBe(Object.prototype);
    expect(Object.keys(labels)).toEqual(['__proto__']);
    expect(parseManifest(toYaml([r]), 'again.yaml')).toEqual([r]);
  });

  it('reads role durations', () => {
    expect(durationMs('8h')).toBe(8 * 3_600_000);
    expect(durationMs('1h30m')).toBe(5_400_000);
    expect(durationMs('1.5h')).toBe(5_400_000);
    expect(durationMs('7d')).toBe(7 * 86_400_000);
    expect(durationMs('90s')).toBe(90_000);
    for (const bad of ['', '8', 'h', '8 h', '-1h', '1y']) expect(durationMs(bad)).toBeUndefined();
    expect(failure(role('  options:\n    max_session_ttl: 0h\n')).details.path).toBe('spec.options.max_session_ttl');
  });

  it('writes kind, version, metadata and spec first in YAML and JSON output', () => {
    const built = { spec: { roles: ['access'] }, metadata: { name: 'x' }, version: 'v2', kind: 'user' };
    expect(toYaml([built]).split('\n').slice(0, 4)).toEqual(['kind: user', 'version: v2', 'metadata:', '  name: x']);
    expect(Object.keys(JSON.parse(toJson([built]))[0])).toEqual(['kind', 'version', 'metadata', 'spec']);
  });
});

describe('docs/resources.md', () => {
  const doc = readFileSync(new URL('../../docs/resources.md', import.meta.url), 'utf8');
  const examples = [...doc.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]!).filter((t) => t.startsWith('kind:'));

  it('has a valid example for every kind', () => {
    const kinds = examples.map((t) => parseManifest(t, 'docs/resources.md').map((r) => r.kind)).flat();
    expect(new Set(kinds)).toEqual(new Set(RESOURCE_KINDS));
    expect(RESOURCE_KINDS).toContain('lock');
  });

  it("shows the seed's role for cluster_maintenance_config", () => {
    const roles = examples.flatMap((t) => parseManifest(t, 'docs/resources.md'));
    expect(roles).toContainEqual(parseManifest(SEED_ROLE, 'seed.yaml')[0]);
  });
});

// --- the maintenance window ----------------------------------------------------------------------------------------

const maintenance = (hour: string, weekdays: string): string =>
  `kind: cluster_maintenance_config\nversion: v1\nspec:\n  agent_upgrades:\n    utc_start_hour: ${hour}\n    weekdays: ${weekdays}\n`;

describe('cluster_maintenance_config', () => {
  const days = (weekdays: string): string[] =>
    (parseManifest(maintenance('3', weekdays), 'm.yaml')[0] as ClusterMaintenanceConfig).spec.agent_upgrades.weekdays;

  it.each([
    ['[Mon, Wed, Fri]', ['Mon', 'Wed', 'Fri']],
    ['[Fri, Mon]', ['Mon', 'Fri']],
    ['[monday, TUESDAY, Sunday]', ['Sun', 'Mon', 'Tue']],
    ['[sat, SUN]', ['Sun', 'Sat']],
    ['["*"]', [...WEEKDAYS]],
    ["['*']", [...WEEKDAYS]],
    ['[Sun, Mon, Tue, Wed, Thu, Fri, Sat]', [...WEEKDAYS]],
  ])('weekdays %s → %j', (written, normalised) => {
    expect(days(written)).toEqual(normalised);
  });

  it("kind: cluster-maintenance-config (upstream's upgrader README writes it so) is the same kind, stored under its own name", () => {
    const [cmc] = parseManifest('kind: cluster-maintenance-config\nspec:\n  agent_upgrades:\n    utc_start_hour: 2\n    weekdays:\n      - Mon\n', 'mw.yaml') as [ClusterMaintenanceConfig];
    expect(cmc).toMatchObject({ kind: 'cluster_maintenance_config', metadata: { name: 'cluster-maintenance-config' }, spec: { agent_upgrades: { utc_start_hour: 2, weekdays: ['Mon'] } } });
  });

  it("weekdays left out means every day (upstream's documentation writes it so), stored as the seven days", () => {
    const [cmc] = parseManifest('kind: cluster_maintenance_config\nversion: v1\nspec:\n  agent_upgrades:\n    utc_start_hour: 3\n', 'm.yaml') as [ClusterMaintenanceConfig];
    expect(cmc.spec.agent_upgrades.weekdays).toEqual([...WEEKDAYS]);
  });

  it.each([0, 12, 23])('accepts utc_start_hour %i', (hour) => {
    const [cmc] = parseManifest(maintenance(String(hour), '[Mon]'), 'm.yaml') as [ClusterMaintenanceConfig];
    expect(cmc.spec.agent_upgrades.utc_start_hour).toBe(hour);
  });

  it('normalises any list of day names to unique short names in canonical order (property)', () => {
    const LONG = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
    const spelling = fc.tuple(fc.integer({ min: 0, max: 6 }), fc.boolean(), fc.constantFrom('lower', 'upper', 'as-is'));
    fc.assert(
      fc.property(fc.uniqueArray(spelling, { minLength: 1, maxLength: 7, selector: ([d]) => d }), (picked) => {
        const names = picked.map(([d, long, c]) => {
          const n = long ? LONG[d]! : WEEKDAYS[d]!;
          return c === 'lower' ? n.toLowerCase() : c === 'upper' ? n.toUpperCase() : n;
        });
        const expected = WEEKDAYS.filter((_, i) => picked.some(([d]) => d === i));
        expect(days(`[${names.join(', ')}]`)).toEqual(expected);
      }),
      { numRuns: 100 },
    );
  });
});

// --- errors --------------------------------------------------------------------------------------------------------

/**
 * [what, manifest, problem code, document, key path, line, column] of the first problem. The thrown code is always
 * GW_ERR_RESOURCE_INVALID.
 */
type Case = [string, string, ErrorCode, number, string, number, number];

const role = (spec: string, name = 'r'): string => `kind: role\nversion: v7\nmetadata:\n  name: ${name}\nspec:\n${spec}`;
const github = (spec: string): string => `kind: github\nversion: v3\nmetadata: {name: gh}\nspec:\n${spec}`;
const GITHUB_BASE = '  client_id: id\n  client_secret: s3cr3t\n  redirect_url: https://gw.example.com/cb\n';
const GITHUB_TEAMS = '  teams_to_roles: [{organization: o, team: t, roles: [access]}]\n';
const oidc = (mapping: string): string =>
  `kind: oidc\nversion: v3\nmetadata: {name: o}\nspec:\n  issuer_url: https://idp.example.com\n  client_id: id\n  client_secret: s\n  redirect_url: https://gw.example.com/cb\n  claims_to_roles:\n    - ${mapping}\n`;
const saml = (descriptor: string): string =>
  `kind: saml\nversion: v2\nmetadata: {name: s}\nspec:\n  acs: https://gw.example.com/acs\n${descriptor}  attributes_to_roles: [{name: groups, value: admins, roles: [editor]}]\n`;
const token = (meta: string, spec: string): string => `kind: token\nversion: v2\nmetadata:\n${meta}spec:\n${spec}`;

const cases: Case[] = [
  // --- YAML and document shape -------------------------------------------------------------------------------------
  ['unclosed flow sequence', 'kind: role\nmetadata: {name: [a\n', 'GW_ERR_CONFIG_SYNTAX', 1, '', 3, 1],
  ['tab indentation', 'kind: role\nmetadata:\n\tname: a\n', 'GW_ERR_CONFIG_SYNTAX', 1, '', 3, 1],
  ['bare * in a list', maintenance('2', '[*]'), 'GW_ERR_CONFIG_SYNTAX', 1, '', 6, 16],
  ['syntax error in the second document', `${SEED_ROLE}---\nkind: user\nmetadata: {name: [x}\n`, 'GW_ERR_CONFIG_SYNTAX', 2, '', 12, 20],
  ['document is a list', '- kind: role\n', 'GW_ERR_CONFIG_TYPE', 1, '', 1, 1],
  ['document is a string', '---\nrole\n', 'GW_ERR_CONFIG_TYPE', 1, '', 2, 1],
  ['alias to no anchor', 'kind: role\nversion: *v\nmetadata: {name: a}\n', 'GW_ERR_CONFIG_SYNTAX', 1, 'version', 2, 10],

  // --- kind and version -------------------------------------------------------------------------------------------
  ['missing kind', 'version: v7\nmetadata: {name: a}\n', 'GW_ERR_CONFIG_VALUE', 1, 'kind', 1, 1],
  ['kind is a list', 'kind: [role]\n', 'GW_ERR_CONFIG_TYPE', 1, 'kind', 1, 7],
  ['unknown kind', `${SEED_ROLE}---\nkind: rolee\nversion: v7\n`, 'GW_ERR_CONFIG_VALUE', 2, 'kind', 11, 7],
  ['kind of another product', 'kind: deployment\n', 'GW_ERR_CONFIG_VALUE', 1, 'kind', 1, 7],
  ['wrong role version', SEED_ROLE.replace('v7', 'v6'), 'GW_ERR_CONFIG_VALUE', 1, 'version', 2, 10],
  ['version is a number', SEED_ROLE.replace('v7', '7'), 'GW_ERR_CONFIG_TYPE', 1, 'version', 2, 10],
  ['missing version', SEED_ROLE.replace('version: v7\n', ''), 'GW_ERR_CONFIG_VALUE', 1, 'version', 1, 1],
  ['wrong maintenance version', maintenance('2', '[Mon]').replace('v1', 'v2'), 'GW_ERR_CONFIG_VALUE', 1, 'version', 2, 10],

  // --- metadata ---------------------------------------------------------------------------------------------------
  ['missing metadata', 'kind: role\nversion: v7\n', 'GW_ERR_CONFIG_VALUE', 1, 'metadata', 1, 1],
  ['missing name', 'kind: role\nversion: v7\nmetadata:\n  description: x\n', 'GW_ERR_CONFIG_VALUE', 1, 'metadata.name', 4, 3],
  ['name with a space', role('  allow: {}\n', '"two words"'), 'GW_ERR_CONFIG_VALUE', 1, 'metadata.name', 4, 9],
  ['name is a number', role('  allow: {}\n', '42'), 'GW_ERR_CONFIG_TYPE', 1, 'metadata.name', 4, 9],
  ['unknown metadata key', 'kind: role\nversion: v7\nmetadata:\n  name: a\n  namespace: default\n', 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'metadata.namespace', 5, 3],
  ['expires is not RFC 3339', 'kind: role\nversion: v7\nmetadata:\n  name: a\n  expires: tomorrow\n', 'GW_ERR_CONFIG_VALUE', 1, 'metadata.expires', 5, 12],
  ['expires on 30 February', 'kind: role\nversion: v7\nmetadata:\n  name: a\n  expires: "2030-02-30T00:00:00Z"\n', 'GW_ERR_CONFIG_VALUE', 1, 'metadata.expires', 5, 12],
  ['metadata label is a list', 'kind: role\nversion: v7\nmetadata:\n  name: a\n  labels: {env: [a]}\n', 'GW_ERR_CONFIG_TYPE', 1, 'metadata.labels.env', 5, 17],
  ['maintenance config with another name', `kind: cluster_maintenance_config\nmetadata: {name: weekly}\n${maintenance('2', '[Mon]').split('\n').slice(2).join('\n')}`, 'GW_ERR_CONFIG_VALUE', 1, 'metadata.name', 2, 18],

  // --- unknown and duplicate keys ------------------------------------------------------------------------------------
  ['unknown top-level key', `${SEED_ROLE}status: {}\n`, 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'status', 10, 1],
  ['typo in a condition key', role('  allow:\n    logns: [root]\n'), 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'spec.allow.logns', 7, 5],
  ['key at the wrong level', role('  logins: [root]\n'), 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'spec.logins', 6, 3],
  ['unknown key in a rule', role('  allow:\n    rules:\n      - resources: [role]\n        verbs: [read]\n        where: x\n'), 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'spec.allow.rules[0].where', 10, 9],
  ['unknown key in agent_upgrades', `${maintenance('2', '[Mon]')}    duration: 1h\n`, 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'spec.agent_upgrades.duration', 7, 5],
  ['duplicate key', 'kind: role\nversion: v7\nmetadata: {name: a}\nversion: v7\n', 'GW_ERR_CONFIG_DUPLICATE_KEY', 1, 'version', 4, 1],

  // --- role -------------------------------------------------------------------------------------------------------
  ['verb typo (second document)', `${SEED_ROLE}---\n${role('  allow:\n    rules:\n      - resources: [role]\n        verbs: [read, wirte]\n', 'dev')}`, 'GW_ERR_CONFIG_VALUE', 2, 'spec.allow.rules[0].verbs[1]', 19, 23],
  ['unknown rule resource', role('  allow:\n    rules: [{resources: [cluster_maintenance], verbs: [read]}]\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.allow.rules[0].resources[0]', 7, 26],
  ['rule without verbs', role('  allow:\n    rules:\n      - resources: [role]\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.allow.rules[0].verbs', 8, 9],
  ['rule with no resources', role('  allow:\n    rules: [{resources: [], verbs: [read]}]\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.allow.rules[0].resources', 7, 25],
  ['verbs is a string', role('  allow:\n    rules: [{resources: [role], verbs: read}]\n'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.allow.rules[0].verbs', 7, 40],
  ['empty rule item', role('  allow:\n    rules:\n      -\n'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.allow.rules[0]', 8, 8],
  ['logins is a string', role('  allow:\n    logins: root\n'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.allow.logins', 7, 13],
  ['login with a space', role('  allow:\n    logins: [root, "a b"]\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.allow.logins[1]', 7, 20],
  ['malformed template', role("  allow:\n    logins: ['{{internal.logins}']\n"), 'GW_ERR_CONFIG_VALUE', 1, 'spec.allow.logins[0]', 7, 14],
  ['label value is a number', role('  allow:\n    node_labels: {env: 3}\n'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.allow.node_labels.env', 7, 24],
  ['label with no value', role('  allow:\n    node_labels:\n      env:\n'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.allow.node_labels.env', 8, 7],
  ['wildcard label with another value', role("  allow:\n    node_labels: {'*': prod}\n"), 'GW_ERR_CONFIG_VALUE', 1, 'spec.allow.node_labels.*', 7, 24],
  ['invalid regular expression', role("  allow:\n    db_labels: {env: '^prod-($'}\n"), 'GW_ERR_CONFIG_VALUE', 1, 'spec.allow.db_labels.env', 7, 22],
  ['labels is a list', role('  deny:\n    app_labels: [env]\n'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.deny.app_labels', 7, 17],
  ['bad max_session_ttl', role('  options:\n    max_session_ttl: 8 hours\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.options.max_session_ttl', 7, 22],
  ['unknown option', role('  options:\n    max_session_tl: 8h\n'), 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'spec.options.max_session_tl', 7, 5],

  // --- user -------------------------------------------------------------------------------------------------------
  ['user roles is a string', 'kind: user\nversion: v2\nmetadata: {name: u}\nspec:\n  roles: access\n', 'GW_ERR_CONFIG_TYPE', 1, 'spec.roles', 5, 10],
  ['user trait is a string', 'kind: user\nversion: v2\nmetadata: {name: u}\nspec:\n  roles: []\n  traits: {logins: root}\n', 'GW_ERR_CONFIG_TYPE', 1, 'spec.traits.logins', 6, 20],
  ['user with a password', 'kind: user\nversion: v2\nmetadata: {name: u}\nspec:\n  roles: []\n  password: hunter22\n', 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'spec.password', 6, 3],

  // --- token ------------------------------------------------------------------------------------------------------
  ['token without roles', token('  name: abcdef\n', '  uses: 1\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.roles', 6, 3],
  ['token with no roles', token('  name: abcdef\n', '  roles: []\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.roles', 6, 10],
  ['token role unknown', token('  name: abcdef\n', '  roles: [node, ssh]\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.roles[1]', 6, 17],
  ['token role twice', token('  name: abcdef\n', '  roles: [node, db, node]\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.roles[2]', 6, 21],
  ['token uses negative', token('  name: abcdef\n', '  roles: [node]\n  uses: -1\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.uses', 7, 9],
  ['token uses fractional', token('  name: abcdef\n', '  roles: [node]\n  uses: 1.5\n'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.uses', 7, 9],
  ['token name is a number', token('  name: 123456\n', '  roles: [node]\n'), 'GW_ERR_CONFIG_TYPE', 1, 'metadata.name', 4, 9],
  ['token expires malformed', token('  name: abcdef\n  expires: 2030-01-01\n', '  roles: [node]\n'), 'GW_ERR_CONFIG_VALUE', 1, 'metadata.expires', 5, 12],

  // --- connectors -------------------------------------------------------------------------------------------------
  ['github without client_secret', github('  client_id: id\n  redirect_url: https://gw.example.com/cb\n' + GITHUB_TEAMS), 'GW_ERR_CONFIG_VALUE', 1, 'spec.client_secret', 5, 3],
  ['github with no mappings', github(`${GITHUB_BASE}  teams_to_roles: []\n`), 'GW_ERR_CONFIG_VALUE', 1, 'spec.teams_to_roles', 8, 19],
  ['github mapping without roles', github(`${GITHUB_BASE}  teams_to_roles:\n    - {organization: o, team: t}\n`), 'GW_ERR_CONFIG_VALUE', 1, 'spec.teams_to_roles[0].roles', 9, 7],
  ['github mapping key typo', github(`${GITHUB_BASE}  teams_to_roles:\n    - {organisation: o, team: t, roles: [a]}\n`), 'GW_ERR_CONFIG_UNKNOWN_KEY', 1, 'spec.teams_to_roles[0].organisation', 9, 8],
  ['github redirect_url not a URL', github('  client_id: id\n  client_secret: s\n  redirect_url: gw.example.com/cb\n' + GITHUB_TEAMS), 'GW_ERR_CONFIG_VALUE', 1, 'spec.redirect_url', 7, 17],
  ['private key not PEM', github(`${GITHUB_BASE}${GITHUB_TEAMS}  signing_key_pair: {cert: "${CERT.replace(/\n/g, '\\n')}", private_key: not-a-key}\n`), 'GW_ERR_CONFIG_VALUE', 1, 'spec.signing_key_pair.private_key', 9, 124],
  ['key pair without private_key', github(`${GITHUB_BASE}${GITHUB_TEAMS}  signing_key_pair:\n    cert: x\n`), 'GW_ERR_CONFIG_VALUE', 1, 'spec.signing_key_pair.private_key', 10, 5],
  ['saml with both descriptors', saml('  entity_descriptor: <xml/>\n  entity_descriptor_url: https://idp.example.com/md\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.entity_descriptor_url', 7, 3],
  // Trust material over plain HTTP: whoever sits on the path would choose the signing certificate or the user.
  ['saml metadata over plain http', saml('  entity_descriptor_url: http://idp.example.com/md\n'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.entity_descriptor_url', 6, 26],
  ['github API over plain http', github(`${GITHUB_BASE}  api_endpoint_url: http://ghe.example.com/api/v3\n${GITHUB_TEAMS}`), 'GW_ERR_CONFIG_VALUE', 1, 'spec.api_endpoint_url', 8, 21],
  ['github pages over plain http', github(`${GITHUB_BASE}  endpoint_url: http://ghe.example.com\n${GITHUB_TEAMS}`), 'GW_ERR_CONFIG_VALUE', 1, 'spec.endpoint_url', 8, 17],
  ['saml with no descriptor', saml(''), 'GW_ERR_CONFIG_VALUE', 1, 'spec.entity_descriptor', 5, 3],
  ['saml mapping value is a list', saml('  entity_descriptor: <xml/>\n').replace('value: admins', 'value: [admins]'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.attributes_to_roles[0].value', 7, 47],
  ['oidc claim and name both', oidc('{claim: groups, name: groups, value: a, roles: [r]}'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.claims_to_roles[0].name', 10, 23],
  ['oidc mapping without claim', oidc('{value: a, roles: [r]}'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.claims_to_roles[0].claim', 10, 7],
  ['oidc bad regular expression', oidc("{claim: groups, value: '^adm(in$', roles: [r]}"), 'GW_ERR_CONFIG_VALUE', 1, 'spec.claims_to_roles[0].value', 10, 30],
  ['oidc role name with a space', oidc('{claim: groups, value: a, roles: ["my role"]}'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.claims_to_roles[0].roles[0]', 10, 41],

  // --- cluster_maintenance_config -------------------------------------------------------------------------------------
  ['hour 24', maintenance('24', '[Mon]'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.agent_upgrades.utc_start_hour', 5, 21],
  ['hour -1', maintenance('-1', '[Mon]'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.agent_upgrades.utc_start_hour', 5, 21],
  ['hour 2.5', maintenance('2.5', '[Mon]'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.agent_upgrades.utc_start_hour', 5, 21],
  ['hour in quotes', maintenance('"2"', '[Mon]'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.agent_upgrades.utc_start_hour', 5, 21],
  ['Mon and monday', maintenance('2', '[Mon, Tue, monday]'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.agent_upgrades.weekdays[2]', 6, 26],
  ['* with a day', maintenance('2', '["*", Mon]'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.agent_upgrades.weekdays', 6, 15],
  ['unknown day', maintenance('2', '[Mon, Mond]'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.agent_upgrades.weekdays[1]', 6, 21],
  ['day as a number', maintenance('2', '[1]'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.agent_upgrades.weekdays[0]', 6, 16],
  ['no days', maintenance('2', '[]'), 'GW_ERR_CONFIG_VALUE', 1, 'spec.agent_upgrades.weekdays', 6, 15],
  ['weekdays is a string', maintenance('2', 'Mon'), 'GW_ERR_CONFIG_TYPE', 1, 'spec.agent_upgrades.weekdays', 6, 15],
  ['missing utc_start_hour', 'kind: cluster_maintenance_config\nspec:\n  agent_upgrades:\n    weekdays: [Mon]\n', 'GW_ERR_CONFIG_VALUE', 1, 'spec.agent_upgrades.utc_start_hour', 4, 5],
  ['missing spec', 'kind: cluster_maintenance_config\n', 'GW_ERR_CONFIG_VALUE', 1, 'spec', 1, 1],

  // --- duplicates across documents ------------------------------------------------------------------------------------
  ['the same role twice', `${SEED_ROLE}---\n${SEED_ROLE}`, 'GW_ERR_RESOURCE_DUPLICATE', 2, 'metadata.name', 14, 9],
  ['two maintenance configs', `${MAINTENANCE}---\n${MAINTENANCE}`, 'GW_ERR_RESOURCE_DUPLICATE', 2, 'metadata.name', 7, 1],
];

describe('parseManifest: every problem has a code, document, key path, line and column', () => {
  it.each(cases)('%s', (_, text, code, document, path, line, column) => {
    const err = failure(text, 'roles.yaml');
    expect(err.code).toBe('GW_ERR_RESOURCE_INVALID');
    expect({ code: problemsOf(err)[0]!.code, document: err.details.document, path: err.details.path, line: err.details.line, column: err.details.column }).toEqual({
      code,
      document,
      path,
      line,
      column,
    });
    expect(err.details.source).toBe('roles.yaml');
    expect(err.message.startsWith(`roles.yaml: document ${document}`)).toBe(true);
    expect(err.hint.length).toBeGreaterThan(0);
  });

  it('reports problems of every document at once, in document order', () => {
    const text = `${role('  allow:\n    logns: [a]\n', 'one')}---\n${SEED_ROLE}---\n${maintenance('24', '[Mon, monday]')}`;
    const err = failure(text);
    expect(problemsOf(err).map((p) => [p.document, p.kind, p.path])).toEqual([
      [1, 'role', 'spec.allow.logns'],
      [3, 'cluster_maintenance_config', 'spec.agent_upgrades.utc_start_hour'],
      [3, 'cluster_maintenance_config', 'spec.agent_upgrades.weekdays[1]'],
    ]);
    expect(err.details).toMatchObject({ document: 1, kind: 'role', name: 'one', path: 'spec.allow.logns' });
  });

  it('names the document, kind and name in the message, as in the brief', () => {
    const err = failure(`${SEED_ROLE}---\n${role('  allow:\n    rules:\n      - resources: [role]\n        verbs: [read, wirte]\n', 'dev')}`, 'roles.yaml');
    expect(err.message).toMatch(
      /^roles\.yaml: document 2 \(role "dev"\): spec\.allow\.rules\[0\]\.verbs\[1\]: expected one of list, read, create, update, delete, \*; got "wirte"/,
    );
    expect(err.details).toMatchObject({ kind: 'role', name: 'dev' });
  });

  it('hints at the nearest known key, kind, resource and version', () => {
    expect(failure(role('  allow:\n    logns: [a]\n')).hint).toContain('`logins`');
    expect(failure(role('  logins: [a]\n')).hint).toMatch(/belongs under `spec\.allow` or `spec\.deny`/);
    expect(failure('kind: rolee\n').hint).toContain('`role`');
    expect(failure('kind: deployment\n').message).toContain('role, user, token, github, saml, oidc, cluster_maintenance_config');
    expect(failure(role('  allow:\n    rules: [{resources: [cluster_maintenance], verbs: [read]}]\n')).hint).toContain('`cluster_maintenance_config`');
    expect(failure(role('  allow:\n    rules: [{resources: [role], verbs: [reed]}]\n')).hint).toContain('`read`');
    expect(failure(token('  name: abcdef\n', '  roles: [nodes]\n')).hint).toContain('`node`');
    const version = failure(SEED_ROLE.replace('v7', 'v6'));
    expect(version.message).toContain('v7');
    expect(version.hint).toContain('v7');
    expect(failure(maintenance('2', '[*]')).hint).toContain('"*"');
  });

  it('never shows a secret in a message, hint or details', () => {
    const secrets = ['tok-3f9a1c77e2', 'cs-91b2e0d4aa', 'pk-5e8c0b3f11'];
    const texts = [
      // The token is valid, another field is wrong: the token's id names the document, never the token.
      token(`  name: ${secrets[0]}\n`, '  roles: [nope]\n'),
      // Secrets of the wrong type are described by shape only.
      github(`  client_id: id\n  client_secret: [${secrets[1]}]\n  redirect_url: https://gw.example.com/cb\n${GITHUB_TEAMS}`),
      github(`${GITHUB_BASE}${GITHUB_TEAMS}  signing_key_pair: {cert: x, private_key: ${secrets[2]}}\n`),
      // A secret under a misspelt kind: the document is not named at all.
      `kind: tokn\nversion: v2\nmetadata: {name: ${secrets[0]}}\n`,
      // The same token twice.
      `${token(`  name: ${secrets[0]}\n`, '  roles: [node]\n')}---\n${token(`  name: ${secrets[0]}\n`, '  roles: [db]\n')}`,
    ];
    for (const text of texts) {
      const err = failure(text);
      const shown = JSON.stringify({ message: err.message, hint: err.hint, details: err.details });
      for (const s of secrets) expect(shown).not.toContain(s);
    }
    const dup = failure(texts[4]!);
    expect(dup.details).toMatchObject({ document: 2, name: tokenId(secrets[0]!) });
    expect(dup.message).toContain(`token ${tokenId(secrets[0]!)}`);
  });

  it('lists at most ten problems in the message but every one in details', () => {
    const logins = Array.from({ length: 15 }, (_, i) => `"bad ${i}"`).join(', ');
    const err = failure(role(`  allow:\n    logins: [${logins}]\n`));
    expect(problemsOf(err)).toHaveLength(15);
    expect(err.message).toContain('and 14 more problems');
    expect(err.message.split('\n').length).toBeLessThanOrEqual(13);
  });

  it('stops walking an alias bomb', () => {
    const levels = ['a: &a [x, x, x, x, x, x, x, x, x, x]'];
    for (let i = 1; i < 12; i++) levels.push(`${'b'.repeat(i)}: &${'b'.repeat(i)} [${Array(10).fill(`*${i === 1 ? 'a' : 'b'.repeat(i - 1)}`).join(', ')}]`);
    const text = `kind: role\nversion: v7\nmetadata: {name: r}\nspec:\n  allow:\n    logins: *${'b'.repeat(11)}\nx:\n${levels.map((l) => `  ${l}`).join('\n')}\n`;
    const started = Date.now();
    const err = failure(text);
    expect(Date.now() - started).toBeLessThan(5000);
    expect(problemsOf(err).some((p) => p.code === 'GW_ERR_CONFIG_SYNTAX' || p.code === 'GW_ERR_CONFIG_UNKNOWN_KEY')).toBe(true);
  });
});

// --- secrets -----------------------------------------------------------------------------------------------------

describe('withoutSecrets', () => {
  it('removes client secrets and private keys, and replaces a token by its id', () => {
    const [gh, saml, oidc, tok] = parseManifest([GITHUB, SAML, OIDC, TOKEN].join('---\n'), 'all.yaml') as [
      GithubConnector,
      SamlConnector,
      OidcConnector,
      TokenResource,
    ];
    const g = withoutSecrets(gh);
    expect(g.spec.client_secret).toBeUndefined();
    expect(g.spec.signing_key_pair).toEqual({ cert: CERT });
    expect(withoutSecrets(saml).spec.signing_key_pair).toEqual({ cert: CERT });
    expect(withoutSecrets(oidc).spec.client_secret).toBeUndefined();
    const t = withoutSecrets(tok);
    expect(t.metadata.name).toBe(tokenId('8a3f5c1e9b7d4f2a6c0e8b1d3f5a7c9e'));
    expect(t.metadata.name).toMatch(/^[0-9a-f]{12}$/);
    expect(t.metadata.expires).toBe('2030-01-31T23:59:59Z');

    const shown = toYaml([g, withoutSecrets(saml), withoutSecrets(oidc), t]);
    for (const secret of ['gh-secret-value', 'oidc-secret-value', 'PRIVATE KEY', '8a3f5c1e9b7d4f2a6c0e8b1d3f5a7c9e']) expect(shown).not.toContain(secret);
    // The input is not changed: the caller decides (--with-secrets) which one to print.
    expect(gh.spec.client_secret).toBe('gh-secret-value');
    expect(toYaml([gh])).toContain('PRIVATE KEY');
  });

  it('leaves resources without secrets as they are', () => {
    const resources = parseManifest([ROLE, USER, MAINTENANCE].join('---\n'), 'x.yaml');
    expect(resources.map((r) => withoutSecrets(r))).toEqual(resources);
  });

  it('tokenId is the first 12 hex digits of the SHA-256 of the token', () => {
    expect(tokenId('abc')).toBe('ba7816bf8f01');
  });
});

// --- connector role mappings ----------------------------------------------------------------------------------------

describe('connector role mappings (seed: teams_to_roles, attributes_to_roles, claims_to_roles)', () => {
  const [gh] = parseManifest(
    github(`${GITHUB_BASE}  teams_to_roles:
    - {organization: octocats, team: admins, roles: [editor, access]}
    - {organization: octocats, team: 'dev-*', roles: [access, dev]}
    - {organization: '^(acme|initech)$', team: sre, roles: [access, maintenance-admin]}
`),
    'gh.yaml',
  ) as [GithubConnector];

  it.each<[string, Array<{ organization: string; team: string }>, string[]]>([
    ['exact organization and team', [{ organization: 'octocats', team: 'admins' }], ['editor', 'access']],
    ['glob team', [{ organization: 'octocats', team: 'dev-frontend' }], ['access', 'dev']],
    ['two teams: unique roles in mapping order', [{ organization: 'octocats', team: 'dev-x' }, { organization: 'octocats', team: 'admins' }], ['editor', 'access', 'dev']],
    ['regular expression organization', [{ organization: 'initech', team: 'sre' }], ['access', 'maintenance-admin']],
    ['team of another organization', [{ organization: 'other', team: 'admins' }], []],
    ['exact match is case-sensitive', [{ organization: 'Octocats', team: 'admins' }], []],
    ['the glob is anchored', [{ organization: 'octocats', team: 'xdev-a' }], []],
    ['the regex is anchored', [{ organization: 'acmeco', team: 'sre' }], []],
    ['no teams', [], []],
  ])('github: %s', (_, teams, roles) => {
    expect(githubRoles(gh, teams)).toEqual(roles);
  });

  const [sml] = parseManifest(
    saml(`  entity_descriptor: <xml/>\n`).replace(
      '  attributes_to_roles: [{name: groups, value: admins, roles: [editor]}]\n',
      () => `  attributes_to_roles:
    - {name: groups, value: admins, roles: [editor]}
    - {name: groups, value: '^team-(a|b)$', roles: [access]}
    - {name: department, value: '*ops', roles: [access, maintenance-admin]}
`,
    ),
    'saml.yaml',
  ) as [SamlConnector];

  it.each<[string, Record<string, string[]>, string[]]>([
    ['one value matches', { groups: ['users', 'admins'] }, ['editor']],
    ['regular expression', { groups: ['team-b'] }, ['access']],
    ['several mappings', { groups: ['admins', 'team-a'], department: ['devops'] }, ['editor', 'access', 'maintenance-admin']],
    ['attribute name must match exactly', { Groups: ['admins'] }, []],
    ['no attributes', {}, []],
    ['prototype names are not attributes', JSON.parse('{"__proto__": ["admins"]}') as Record<string, string[]>, []],
  ])('saml: %s', (_, attributes, roles) => {
    expect(samlRoles(sml, attributes)).toEqual(roles);
  });

  const [oid] = parseManifest(
    oidc(`{name: groups, value: admins, roles: [editor]}
    - {claim: email, value: '*@example.com', roles: [access]}
    - {claim: groups, value: '^sre-[0-9]+$', roles: [maintenance-admin, access]}`),
    'oidc.yaml',
  ) as [OidcConnector];

  it.each<[string, Record<string, unknown>, string[]]>([
    ['claim as an array', { groups: ['users', 'admins'] }, ['editor']],
    ['claim as a string', { groups: 'admins' }, ['editor']],
    ['glob on a string claim', { email: 'bob@example.com' }, ['access']],
    ['regex on an array claim, unique roles', { email: 'bob@example.com', groups: ['sre-1'] }, ['access', 'maintenance-admin']],
    ['non-string claims never match', { groups: 42, email: { x: 'bob@example.com' } }, []],
    ['non-string array items are skipped', { groups: [1, null, 'admins'] }, ['editor']],
    ['glob does not match another domain', { email: 'bob@example.com.evil' }, []],
    ['inherited names are not claims', { constructor: 'admins' }, []],
  ])('oidc: %s', (_, claims, roles) => {
    expect(oidcRoles(oid, claims)).toEqual(roles);
  });

  it('the seed spelling `name` and the canonical `claim` map the same way', () => {
    expect(oid.spec.claims_to_roles[0]).toEqual({ claim: 'groups', value: 'admins', roles: ['editor'] });
  });
});

// --- properties ----------------------------------------------------------------------------------------------------

/** parseManifest either returns resources (which round-trip) or throws GW_ERR_RESOURCE_INVALID with a position. */
function checkParse(text: string): void {
  let resources: AnyResource[];
  try {
    resources = parseManifest(text, 'fuzz.yaml');
  } catch (err) {
    if (!(err instanceof GatewayError)) throw err;
    expect(err.code).toBe('GW_ERR_RESOURCE_INVALID');
    const d = err.details;
    expect(typeof d.path).toBe('string');
    for (const n of [d.document, d.line, d.column]) expect(Number.isInteger(n) && (n as number) >= 1).toBe(true);
    expect(err.message.startsWith('fuzz.yaml: document ')).toBe(true);
    return;
  }
  expect(parseManifest(toYaml(resources), 'again.yaml')).toEqual(resources);
}

const KEYS = [
  'kind', 'version', 'metadata', 'name', 'spec', 'allow', 'deny', 'options', 'logins', 'node_labels', 'db_labels', 'rules',
  'resources', 'verbs', 'roles', 'traits', 'uses', 'expires', 'labels', 'agent_upgrades', 'utc_start_hour', 'weekdays',
  'client_id', 'client_secret', 'redirect_url', 'teams_to_roles', 'organization', 'team', 'claims_to_roles', 'claim', 'value',
  'attributes_to_roles', 'acs', 'entity_descriptor', 'issuer_url', 'signing_key_pair', 'cert', 'private_key', '*', '__proto__',
];
const scalar = fc.oneof(
  fc.constantFrom('role', 'user', 'token', 'github', 'saml', 'oidc', 'cluster_maintenance_config', 'v1', 'v2', 'v3', 'v7', 'read', '*',
    'Mon', 'monday', 'node', 'https://x.example.com', '^a.*$', '^($', '{{internal.logins}}', '2030-01-01T00:00:00Z', ''),
  fc.string({ maxLength: 10 }),
  fc.integer({ min: -5, max: 30 }),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
);
const value: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  node: fc.oneof({ depthSize: 'small', withCrossShrink: true }, scalar, tie('list'), tie('map')),
  list: fc.array(tie('node'), { maxLength: 4 }),
  map: fc.dictionary(fc.oneof(fc.constantFrom(...KEYS), fc.string({ maxLength: 6 })), tie('node'), { maxKeys: 5 }),
})).node;

/** Valid documents with one value replaced somewhere (by path), to reach deep validation code. */
function mutate(doc: unknown, path: number[], replacement: unknown): unknown {
  if (path.length === 0 || typeof doc !== 'object' || doc === null) return replacement;
  const entries = Array.isArray(doc) ? doc.map((v, i) => [i, v] as const) : Object.entries(doc);
  if (entries.length === 0) return replacement;
  const [head, ...rest] = path as [number, ...number[]];
  const at = head % entries.length;
  const copy: any = Array.isArray(doc) ? [...doc] : { ...doc };
  copy[entries[at]![0]] = mutate(entries[at]![1], rest, replacement);
  return copy;
}
const validDocs = VALID.map(([, t]) => parseManifest(t, 'v.yaml')[0]);

describe('parseManifest never throws anything but GW_ERR_RESOURCE_INVALID', () => {
  it('on arbitrary strings', () => {
    fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 200 }), checkParse), { numRuns: 300 });
  });

  it('on strings made of YAML punctuation and document markers', () => {
    const chars = fc.constantFrom(...'kind: role-\n\t[]{}&*!|>\'"%@`#,?~01.v/'.split(''), '---\n', 'kind: role\n', 'version: v7\n');
    fc.assert(fc.property(fc.string({ unit: chars, maxLength: 80 }), checkParse), { numRuns: 500 });
  });

  it('on arbitrary YAML documents', () => {
    fc.assert(fc.property(fc.anything(), (v) => checkParse(stringify(v) ?? '')), { numRuns: 200 });
  });

  it('on resource-shaped documents', () => {
    const doc = fc.record({ kind: scalar, version: scalar, metadata: value, spec: value }, { requiredKeys: [] });
    fc.assert(fc.property(fc.array(doc, { maxLength: 3 }), (docs) => checkParse(docs.map((d) => stringify(d)).join('---\n'))), { numRuns: 300 });
  });

  it('on valid manifests with one value replaced', () => {
    fc.assert(
      fc.property(fc.constantFrom(...validDocs), fc.array(fc.nat(), { maxLength: 6 }), value, (doc, path, replacement) => {
        checkParse(stringify(mutate(doc, path, replacement)));
      }),
      { numRuns: 500 },
    );
  });
});
