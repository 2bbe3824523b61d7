/**
 * The resource kinds declared with the configuration's schema kit (src/config/spec.ts): one table per kind, walked
 * over the YAML AST so that every problem has a key path, line and column. manifest.ts picks the table by `kind`.
 */
import { isMap, isNode, isScalar, isSeq, type Node } from 'yaml';
import {
  Invalid,
  describeNode,
  int,
  join,
  keyIndex,
  leaf,
  listOf,
  mapOf,
  nearest,
  section,
  str,
  type AnySpec,
  httpUrl,
  oneOf,
  type Ctx,
  type Infer,
  type Leaf,
  type Spec,
} from '../../config/spec.js';
import type { ErrorCode } from '../../errors.js';
import { normalizeVersion } from '../../wire/versions.js';
import { TEMPLATE, patternProblem } from './match.js';
import {
  AUTOUPDATE_GROUP_NAME,
  AUTOUPDATE_MAX_CANARIES,
  AUTOUPDATE_MAX_GROUPS,
  AUTOUPDATE_MODES,
  AUTOUPDATE_STRATEGIES,
  RESOURCE_KINDS,
  SINGLETON_NAMES,
  isSingleton,
  RESOURCE_VERSIONS,
  RULE_RESOURCES,
  TOKEN_ROLES,
  VERBS,
  WEEKDAYS,
  type AnyResource,
  type Metadata,
  type ResourceKind,
  type Weekday,
} from './types.js';

const quote = (s: string): string => JSON.stringify(s);

// --- spec helpers ------------------------------------------------------------------------------------------------

/** Absent, or an empty / null scalar. */
export function isNullish(node: unknown): boolean {
  return node === undefined || node === null || (isScalar(node) && node.value === null);
}

/** The same spec, but an absent or null value stays undefined (no default object, no empty map). */
function optional<T>(spec: Spec<T>): Spec<T | undefined> {
  return { ...spec, resolve: (node, path, ctx, at) => (isNullish(node) ? undefined : spec.resolve(node, path, ctx, at)) };
}

/** The same spec, but a null value (a key with nothing after it) is a problem. For map values. */
function present<T>(spec: Spec<T>, expected: string): Spec<T> {
  return {
    ...spec,
    resolve: (node, path, ctx, at) => {
      if (node !== undefined && isNullish(node)) ctx.report('GW_ERR_CONFIG_TYPE', path, at ?? node, `expected ${expected}, got nothing`);
      return spec.resolve(node, path, ctx, at);
    },
  };
}

/** The same spec with its value transformed (and, through ctx, checked once more) after resolving. */
function mapped<A, B>(spec: Spec<A>, fn: (value: A, node: unknown, path: string, ctx: Ctx) => B): Spec<B> {
  return { ...spec, resolve: (node, path, ctx, at) => fn(spec.resolve(node, path, ctx, at), node, path, ctx) } as Spec<B>;
}

/**
 * The same spec with a cross-field check that runs when the value itself had no problem; unlike section's check it
 * gets the mapping node, so that it can point at one of its keys (keyOf).
 */
function checked<T>(spec: Spec<T>, check: (value: NonNullable<T>, node: Node, path: string, ctx: Ctx) => void): Spec<T> {
  return {
    ...spec,
    resolve: (node, path, ctx, at) => {
      const before = ctx.issues.length;
      const value = spec.resolve(node, path, ctx, at);
      const n = ctx.deref(node, path);
      if (ctx.issues.length === before && value !== undefined && value !== null && n !== undefined) check(value as NonNullable<T>, n, path, ctx);
      return value;
    },
  };
}

/** The key node of key in a mapping node (to point at it), else the mapping itself. */
function keyOf(node: Node, key: string): Node {
  const pair = isMap(node) ? node.items.find((p) => isScalar(p.key) && p.key.value === key) : undefined;
  return isNode(pair?.key) ? pair.key : node;
}

/** A value's shape, never its content: for secrets. */
function shapeOf(node: Node): string {
  if (isMap(node)) return 'a mapping';
  if (isSeq(node)) return 'a list';
  if (isScalar(node)) {
    if (node.value === null) return 'nothing';
    if (typeof node.value === 'number' || typeof node.value === 'bigint') return 'a number';
    if (typeof node.value === 'boolean') return 'a boolean';
    if (typeof node.value === 'string') return 'a string';
  }
  return 'another kind of value';
}

/** A string that never appears in a message: problems name its shape only. */
function secret(doc: string, check?: (s: string) => void): Leaf<string | undefined> {
  return leaf<string | undefined>({
    doc,
    type: 'string (secret)',
    default: undefined,
    defaultDoc: 'none',
    render: (v) => (v === undefined ? '' : '***'),
    parse: (node) => {
      if (!isScalar(node) || typeof node.value !== 'string') {
        throw new Invalid(`expected a string, got ${shapeOf(node)}`, 'GW_ERR_CONFIG_TYPE', 'Put the value in quotes to make it a string.');
      }
      if (node.value.trim() === '') throw new Invalid('expected a non-empty string, got an empty one');
      check?.(node.value);
      return node.value;
    },
  });
}

function strings(doc: string, item: Leaf<string | undefined>, what: string, o: { min?: number; default?: string[] } = {}) {
  return listOf<string>(doc, item as Spec<string>, { type: `list of ${what}s`, expected: `a list of ${what}s`, ...o });
}

// --- value checks ------------------------------------------------------------------------------------------------

const CONTROL = /[\u0000-\u001f\u007f]/;
const SPACE_OR_CONTROL = /[\s\u0000-\u001f\u007f]/;

/** Names of resources, roles and traits: non-empty, no spaces or control characters, at most 253 characters. */
function name(what: string) {
  return (s: string): string => {
    if (s === '') throw new Invalid(`expected a ${what}, got an empty string`);
    if (SPACE_OR_CONTROL.test(s)) throw new Invalid(`expected a ${what} without spaces or control characters, got ${quote(s)}`);
    if (s.length > 253) throw new Invalid(`expected a ${what} of at most 253 characters, got ${s.length}`);
    return s;
  };
}

function text(what: string) {
  return (s: string): string => {
    if (s.trim() === '') throw new Invalid(`expected a ${what}, got an empty string`);
    return s;
  };
}

const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))$/;

/** An RFC 3339 time stamp with a time zone: 2030-01-31T23:59:59Z, 2030-01-31T23:59:59.5+02:00. */
export function checkRfc3339(s: string): string {
  const m = RFC3339.exec(s);
  const bad = (): never => {
    throw new Invalid(`expected an RFC 3339 time such as 2030-01-31T23:59:59Z, got ${quote(s)}`);
  };
  if (!m) return bad();
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  const daysInMonth = new Date(Date.UTC(year, month, 0)).getUTCDate();
  const offsetOk = m[8] === undefined || (Number(m[8]) < 24 && Number(m[9]) < 60);
  if (month < 1 || month > 12 || day < 1 || day > daysInMonth || hour > 23 || minute > 59 || second > 59 || !offsetOk) bad();
  if (Number.isNaN(Date.parse(s.replace(' ', 'T')))) bad();
  return s;
}

const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const DURATION = /^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+$/;

/**
 * A role duration (8h, 30m, 1h30m, 1.5h, 7d; units ms, s, m, h, d) in milliseconds; undefined when s is not one.
 * The integer forms are those of src/duration.ts (the CLI's --ttl), so the two read the same text the same way.
 */
export function durationMs(s: string): number | undefined {
  if (!DURATION.test(s)) return undefined;
  let ms = 0;
  for (const m of s.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d)/g)) ms += Number(m[1]) * DURATION_UNITS[m[2]!]!;
  return ms;
}

function duration(s: string): string {
  const ms = durationMs(s);
  if (ms === undefined || ms <= 0) throw new Invalid(`expected a positive duration such as 8h, 30m or 1h30m, got ${quote(s)}`);
  return s;
}


/** A login, database name or user: a literal, or one template that expands to the user's trait values. */
function templated(what: string) {
  return (s: string): string => {
    if (s.includes('{') || s.includes('}')) {
      if (!TEMPLATE.test(s)) {
        throw new Invalid(`expected a ${what} or a template such as {{internal.logins}}, got ${quote(s)}`, 'GW_ERR_CONFIG_VALUE', 'Templates read user traits: {{internal.<trait>}} or {{external.<trait>}}.');
      }
      return s;
    }
    return name(what)(s);
  };
}

/** A label or claim value: literal, glob with `*`, or `^regex$` (which must compile). */
function pattern(s: string): string {
  if (CONTROL.test(s)) throw new Invalid(`expected a value without control characters, got ${quote(s)}`);
  const problem = patternProblem(s);
  if (problem) throw new Invalid(problem);
  return s;
}

function labelKey(s: string): void {
  if (s === '' || SPACE_OR_CONTROL.test(s)) throw new Invalid(`expected a label name without spaces, got ${quote(s)}`);
}

const PEM = /-----BEGIN [A-Z0-9 ]+-----[\s\S]+-----END [A-Z0-9 ]+-----/;

function pem(what: string) {
  return (s: string): string => {
    // Never echo the value: it may be a private key.
    if (!PEM.test(s)) throw new Invalid(`expected a PEM-encoded ${what} (-----BEGIN ...-----), got something else`);
    return s;
  };
}

// --- fields ------------------------------------------------------------------------------------------------------

const roleName = str('A role name.', { check: name('role name') });
const roleNames = (min?: number) => strings('Role names.', roleName, 'role name', min === undefined ? {} : { min });

/**
 * One word of a fixed vocabulary (verbs, rule resources, join roles), matched without regard to case and stored in
 * lowercase; a near miss gets a "did you mean" hint (a typo, or a prefix such as cluster_maintenance).
 */
function vocabulary<const V extends string>(doc: string, values: readonly V[]): Spec<V> {
  const allowed = values.join(', ');
  return leaf<V | undefined>({
    doc,
    type: values.join(' | '),
    default: undefined,
    defaultDoc: 'none',
    render: (v) => v ?? '',
    parse: (node) => {
      if (!isScalar(node) || typeof node.value !== 'string') throw new Invalid(`expected one of ${allowed}; got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE');
      const s = node.value.toLowerCase();
      if ((values as readonly string[]).includes(s)) return s as V;
      const near = nearest(s, values) ?? (s.length >= 4 ? values.find((v) => v.startsWith(s)) : undefined);
      throw new Invalid(`expected one of ${allowed}; got ${describeNode(node)}`, 'GW_ERR_CONFIG_VALUE', near ? `did you mean \`${near}\`?` : undefined);
    },
  }) as Spec<V>;
}

const rule = section(
  'One rule: verbs granted (or denied) on resources.',
  {
    resources: listOf('Resource names, or * for all.', vocabulary('A resource name.', RULE_RESOURCES), {
      type: 'list of resource names',
      expected: 'a list of resource names',
      min: 1,
    }),
    verbs: listOf('Verbs, or * for all.', vocabulary('A verb.', VERBS), {
      type: 'list of verbs',
      expected: 'a list of verbs',
      min: 1,
    }),
  },
  { required: ['resources', 'verbs'], expected: 'a rule (a mapping with resources and verbs)' },
);

/** One label value: a pattern, or a non-empty list of them. */
const labelPattern = str('A label value: literal, glob with *, or ^regex$.', { check: pattern });
const labelPatterns = strings('Label values.', labelPattern, 'label value', { min: 1 });
const labelValue: Spec<string | string[] | undefined> = {
  ...labelPattern,
  type: 'string or list of strings',
  resolve: (node, path, ctx, at) => {
    const n = ctx.deref(node, path);
    return isSeq(n) ? labelPatterns.resolve(n, path, ctx, at) : labelPattern.resolve(n, path, ctx, at);
  },
} as Leaf<string | string[] | undefined>;

function labels(doc: string): Spec<Record<string, string | string[]> | undefined> {
  const map = mapOf<string | string[] | undefined>(doc, {
    type: 'map: label → value or list of values',
    key: '<label>',
    checkKey: labelKey,
    value: present(labelValue, 'a label value'),
    expected: 'a mapping of labels',
    example: {},
  });
  return optional(
    mapped(map, (value, node, path, ctx) => {
      const star = Object.hasOwn(value, '*') ? value['*'] : undefined;
      const onlyStar = star === '*' || (Array.isArray(star) && star.length > 0 && star.every((v) => v === '*'));
      if (star !== undefined && !onlyStar) {
        const n = ctx.deref(node, path);
        const pair = isMap(n) ? n.items.find((p) => isScalar(p.key) && p.key.value === '*') : undefined;
        ctx.report('GW_ERR_CONFIG_VALUE', join(path, '*'), isNode(pair?.value) ? pair.value : n, "the label name `*` only takes the value `*` ('*': '*' matches everything)");
      }
      return value as Record<string, string | string[]>;
    }),
  );
}

const conditions = (which: 'allow' | 'deny') =>
  section(`What the role ${which === 'allow' ? 'grants' : 'forbids (deny wins over allow)'}.`, {
    logins: strings('OS logins; {{internal.logins}} expands to the user\'s logins trait.', str('A login.', { check: templated('login') }), 'login'),
    node_labels: labels('Labels of SSH nodes.'),
    db_labels: labels('Labels of databases.'),
    app_labels: labels('Labels of applications.'),
    kubernetes_labels: labels('Labels of Kubernetes clusters.'),
    windows_desktop_labels: labels('Labels of Windows desktops.'),
    db_names: strings('Database names.', str('A database name.', { check: templated('database name') }), 'database name'),
    db_users: strings('Database users.', str('A database user.', { check: templated('database user') }), 'database user'),
    kubernetes_users: strings('Kubernetes users the gateway impersonates; {{internal.kubernetes_users}} expands to the user\'s trait.', str('A Kubernetes user.', { check: templated('Kubernetes user') }), 'Kubernetes user'),
    kubernetes_groups: strings('Kubernetes groups the gateway impersonates; {{internal.kubernetes_groups}} expands to the user\'s trait.', str('A Kubernetes group.', { check: templated('Kubernetes group') }), 'Kubernetes group'),
    rules: listOf('Verbs on resources of the cluster (gwctl).', rule, { type: 'list of rules', expected: 'a list of rules' }),
  });

const roleSpec = section('The role.', {
  allow: optional(conditions('allow')),
  deny: optional(conditions('deny')),
  options: optional(
    section('Options.', {
      max_session_ttl: str('Longest certificate lifetime for users with this role.', { type: 'duration', check: duration }),
    }),
  ),
});

const traits = optional(
  mapOf<string[] | undefined>('Traits: name → values.', {
    type: 'map: trait → list of strings',
    key: '<trait>',
    checkKey: (s) => void name('trait name')(s),
    value: present(strings('Trait values.', str('A trait value.', { check: text('trait value') }), 'string'), 'a list of strings'),
    expected: 'a mapping of traits',
    example: {},
  }),
);

const userSpec = section('The user.', {
  roles: strings('Role names.', roleName, 'role name', { default: [] }),
  traits,
  // Written by the Auth Service for a user of an identity provider; accepted back so that `gwctl get` output can be re-created.
  created_by: optional(
    section('Set by the Auth Service for a user who signed in through a connector.', {
      connector: str('The connector\'s name.', { check: name('connector name') }),
      kind: vocabulary('The connector\'s kind.', ['oidc', 'saml', 'github'] as const),
      time: str('RFC 3339: the sign-in that last wrote the record.'),
    }, { required: ['connector', 'kind', 'time'] }),
  ),
});

const tokenSpec = section(
  'The join token.',
  {
    roles: listOf('What the token joins as.', vocabulary('A join role.', TOKEN_ROLES), {
      type: 'list of join roles',
      expected: 'a list of join roles',
      min: 1,
      unique: (v) => v,
    }),
    uses: int('Joins allowed; 0 = unlimited until it expires.', { min: 0, max: Number.MAX_SAFE_INTEGER }),
  },
  { required: ['roles'] },
);

const keyPair = optional(
  section(
    'Key pair that signs requests to the identity provider.',
    {
      cert: str('PEM certificate.', { check: pem('certificate') }),
      private_key: secret('PEM private key (secret).', (s) => void pem('private key')(s)),
    },
    { required: ['cert', 'private_key'] },
  ),
);

const display = str('Name shown on the login button.', { check: text('display name') });
const idpCa = str("PEM CA certificate(s) trusted for the identity provider's HTTPS endpoints, besides the system's.", { check: pem('certificate') });
const url = (doc: string) => str(doc, { type: 'URL', check: httpUrl });
/**
 * Where trust comes from (SAML metadata with the signing certificates, the code-hosting service that names the
 * user): HTTPS only, as OIDC's issuer already is (openid-client refuses http://), so nobody on the path chooses them.
 */
const httpsUrl = (doc: string) =>
  str(doc, {
    type: 'URL',
    check: (s) => {
      httpUrl(s);
      if (!/^https:/i.test(s)) throw new Invalid(`expected an https:// URL, got ${JSON.stringify(s.slice(0, 200))}`, 'GW_ERR_CONFIG_VALUE', 'The identity provider\'s answers decide who signs in: fetch them over HTTPS (a private CA goes in `ca`).');
      return s;
    },
  });
const mappingValue = str('Value to match: exact, glob with *, or ^regex$.', { check: pattern });

const githubSpec = section(
  'GitHub OAuth connector.',
  {
    client_id: str('OAuth app client ID.', { check: text('client ID') }),
    client_secret: secret('OAuth app client secret.'),
    redirect_url: url('Callback URL: https://<proxy>/webapi/sso/github/callback.'),
    endpoint_url: httpsUrl('Web address of the code-hosting service (its OAuth pages); default https://github.com.'),
    api_endpoint_url: httpsUrl('Address of its REST API; default https://api.github.com.'),
    ca: idpCa,
    teams_to_roles: listOf(
      'Team → roles mappings.',
      section(
        'Members of organization/team get roles.',
        { organization: mappingValue, team: mappingValue, roles: roleNames(1) },
        { required: ['organization', 'team', 'roles'] },
      ),
      { type: 'list of mappings', expected: 'a list of mappings (organization, team, roles)', min: 1 },
    ),
    display,
    signing_key_pair: keyPair,
  },
  { required: ['client_id', 'client_secret', 'redirect_url', 'teams_to_roles'] },
);

const samlSpec = section(
  'SAML connector.',
  {
    acs: url('Assertion consumer service URL: https://<proxy>/webapi/sso/saml/acs.'),
    service_provider_issuer: str('Entity ID of the gateway as service provider (the audience of assertions); default the acs URL.', { check: text('entity ID') }),
    ca: idpCa,
    entity_descriptor: str("The identity provider's metadata XML.", { check: text('metadata XML') }),
    entity_descriptor_url: httpsUrl("URL of the identity provider's metadata XML."),
    attributes_to_roles: listOf(
      'Attribute → roles mappings.',
      section(
        'Users whose attribute name has a matching value get roles.',
        { name: str('Attribute name.', { check: text('attribute name') }), value: mappingValue, roles: roleNames(1) },
        { required: ['name', 'value', 'roles'] },
      ),
      { type: 'list of mappings', expected: 'a list of mappings (name, value, roles)', min: 1 },
    ),
    signing_key_pair: keyPair,
    display,
  },
  { required: ['acs', 'attributes_to_roles'] },
);

const samlChecked = checked(samlSpec, (v, node, path, ctx) => {
  if (v.entity_descriptor !== undefined && v.entity_descriptor_url !== undefined) {
    ctx.report('GW_ERR_CONFIG_VALUE', join(path, 'entity_descriptor_url'), keyOf(node, 'entity_descriptor_url'), 'sets both entity_descriptor and entity_descriptor_url', 'Give exactly one of the two.');
  } else if (v.entity_descriptor === undefined && v.entity_descriptor_url === undefined) {
    ctx.report('GW_ERR_CONFIG_VALUE', join(path, 'entity_descriptor'), node, 'sets neither entity_descriptor nor entity_descriptor_url', 'Give exactly one of the two.');
  }
});

const claimMapping = mapped(
  checked(
    section(
      'Users whose claim has a matching value get roles.',
      {
        claim: str('Claim name (canonical key).', { check: text('claim name') }),
        name: str('Claim name (alternative spelling of claim).', { check: text('claim name') }),
        value: mappingValue,
        roles: roleNames(1),
      },
      { required: ['value', 'roles'] },
    ),
    (v, node, path, ctx) => {
      if (v.claim !== undefined && v.name !== undefined) {
        ctx.report('GW_ERR_CONFIG_VALUE', join(path, 'name'), keyOf(node, 'name'), 'sets both claim and name (two spellings of the same key)', 'Keep `claim`, the canonical spelling.');
      } else if (v.claim === undefined && v.name === undefined) {
        ctx.report('GW_ERR_CONFIG_VALUE', join(path, 'claim'), node, 'missing required key `claim`', 'Name the claim to match: claim: groups.');
      }
    },
  ),
  (v) => ({ claim: v.claim ?? v.name, value: v.value, roles: v.roles }),
);

/** true or false, absent when not set (so stored connectors carry only what was written). */
const optionalBoolean = (doc: string) => leaf<boolean | undefined>({
  doc,
  type: 'boolean',
  default: undefined,
  defaultDoc: 'false',
  render: (v) => String(v ?? false),
  parse: (node) => {
    if (isScalar(node) && typeof node.value === 'boolean') return node.value;
    throw new Invalid(`expected true or false, got ${describeNode(node)}`);
  },
});

const oidcSpec = section(
  'OIDC connector.',
  {
    issuer_url: url("The identity provider's issuer URL."),
    client_id: str('Client ID.', { check: text('client ID') }),
    client_secret: secret('Client secret.'),
    redirect_url: url('Callback URL: https://<proxy>/webapi/sso/oidc/callback.'),
    username_claim: str('Claim that names the user; default email, and only when verified (no fallback to another claim).', { check: text('claim name') }),
    allow_unverified_email: optionalBoolean('true: an email names the user even when email_verified is absent or false.'),
    scope: strings('Scopes asked for besides openid (e.g. email, groups).', str('A scope.', { check: name('scope') }), 'scope'),
    ca: idpCa,
    claims_to_roles: listOf('Claim → roles mappings.', claimMapping, {
      type: 'list of mappings',
      expected: 'a list of mappings (claim, value, roles)',
      min: 1,
    }),
    signing_key_pair: keyPair,
    display,
  },
  { required: ['issuer_url', 'client_id', 'client_secret', 'redirect_url', 'claims_to_roles'] },
);

const WEEKDAY_NAMES = new Map<string, Weekday | '*'>([['*', '*']]);
for (const [i, short] of WEEKDAYS.entries()) {
  WEEKDAY_NAMES.set(short.toLowerCase(), short);
  WEEKDAY_NAMES.set(['sunday', 'monday', 'tuesday', 'wednesday', 'thursday', 'friday', 'saturday'][i]!, short);
}

const weekday = leaf<string | undefined>({
  doc: 'A day: Sun..Sat or Sunday..Saturday (any case), or * for every day.',
  type: 'weekday',
  default: undefined,
  defaultDoc: 'none',
  render: (v) => v ?? '',
  parse: (node) => {
    const day = isScalar(node) && typeof node.value === 'string' ? WEEKDAY_NAMES.get(node.value.toLowerCase()) : undefined;
    if (day !== undefined) return day;
    throw new Invalid(
      `expected a weekday (Sun, Mon, Tue, Wed, Thu, Fri, Sat, their long names, or "*"), got ${describeNode(node)}`,
      isScalar(node) && typeof node.value === 'string' ? 'GW_ERR_CONFIG_VALUE' : 'GW_ERR_CONFIG_TYPE',
    );
  },
});

// Left out: every day, as upstream's documentation and its window code read it. An empty list is refused rather
// than read as "every day"; "*" says every day (why: docs/resources.md).
const weekdays = mapped(
  listOf<string>('Days on which the window opens.', weekday as Spec<string>, {
    type: 'list of weekdays',
    expected: 'a list of weekdays',
    unique: (v) => v,
  }),
  (value, node, path, ctx): Weekday[] | undefined => {
    if (value === undefined) return [...WEEKDAYS];
    const n = ctx.deref(node, path);
    if (isSeq(n) && n.items.length === 0) {
      ctx.report('GW_ERR_CONFIG_VALUE', path, n, 'expected at least one day, got an empty list', 'List the days on which upgrades may run, or write ["*"] for every day.');
      return undefined;
    }
    if (value.includes('*')) {
      if (value.length > 1) {
        ctx.report('GW_ERR_CONFIG_VALUE', path, ctx.deref(node, path), '"*" already means every day', 'Write "*" alone, or list the days.');
      }
      return [...WEEKDAYS];
    }
    return WEEKDAYS.filter((d) => value.includes(d));
  },
);

const maintenanceSpec = section(
  'The cluster maintenance configuration.',
  {
    agent_upgrades: section(
      'When agents may upgrade: a one-hour window, weekly.',
      {
        utc_start_hour: int('Hour (UTC) at which the window opens; it lasts one hour.', { min: 0, max: 23 }),
        weekdays,
      },
      { required: ['utc_start_hour'] },
    ),
  },
  { required: ['agent_upgrades'] },
);

const lockTarget = section(
  'Who is locked: exactly one of user, role or node.',
  {
    user: str('A user name: every request and connection of that user is refused.', { check: name('user name') }),
    role: str('A role name: every user holding the role is refused.', { check: name('role name') }),
    node: str("An agent's host ID (gwctl get nodes): its tunnel is dropped and refused.", { check: name('host ID') }),
  },
  { expected: 'a lock target (a mapping with one of user, role, node)' },
);

const lockSpec = checked(
  section(
    'The lock.',
    {
      target: lockTarget,
      message: str('Shown with every refusal.', { check: text('message') }),
      expires: str('When the lock ends by itself (RFC 3339); absent = until removed.', { type: 'RFC 3339 time', check: checkRfc3339 }),
      created_at: str('Set by the Auth Service when the lock is stored.', { type: 'RFC 3339 time', check: checkRfc3339 }),
      created_by: str('Set by the Auth Service when the lock is stored.'),
    },
    { required: ['target'] },
  ),
  (v, node, path, ctx) => {
    const given = (['user', 'role', 'node'] as const).filter((k) => v.target[k] !== undefined);
    if (given.length !== 1) {
      const targetNode = isMap(node) ? node.items.find((p) => isScalar(p.key) && p.key.value === 'target')?.value : undefined;
      ctx.report(
        'GW_ERR_CONFIG_VALUE',
        join(path, 'target'),
        isNode(targetNode) ? targetNode : keyOf(node, 'target'),
        given.length === 0 ? 'names nobody: give one of user, role or node' : `names ${given.join(' and ')}: a lock has exactly one target`,
        'Write one lock per target.',
      );
    }
  },
);

// --- managed rollouts (docs/upgrades.md, "Managed rollouts") ----------------------------------------------------
// Every problem of these two kinds carries a GW_ERR_AUTOUPDATE_* code, so a script tells a bad time zone from a bad
// version without reading the message.

/** An integer in [min, max] whose problems carry code (int() reports GW_ERR_CONFIG_*). */
function rolloutInt(doc: string, min: number, max: number, def: number, code: ErrorCode = 'GW_ERR_AUTOUPDATE_SCHEDULE'): Spec<number> {
  return leaf<number>({
    doc,
    type: `integer ${min}..${max}`,
    default: def,
    render: String,
    parse: (node) => {
      if (!isScalar(node) || typeof node.value !== 'number' || !Number.isInteger(node.value) || node.value < min || node.value > max) {
        throw new Invalid(`expected an integer from ${min} to ${max}, got ${describeNode(node)}`, code);
      }
      return node.value;
    },
  });
}

/** A duration (1h, 30m, 10s) of at least minMs. */
function rolloutDuration(doc: string, def: string, minMs: number): Spec<string> {
  return str(doc, {
    type: 'duration',
    default: def,
    check: (s) => {
      const ms = durationMs(s);
      if (ms === undefined || ms < minMs) {
        throw new Invalid(`expected a duration of at least ${minMs / 1000}s such as ${def}, got ${quote(s.slice(0, 64))}`, 'GW_ERR_AUTOUPDATE_SCHEDULE', 'Durations are written 30s, 5m, 1h, 1h30m or 7d.');
      }
      return s;
    },
  });
}

/** Whether this Node.js knows name as an IANA time zone (Intl refuses the others). */
export function isTimeZone(name: string): boolean {
  if (name.length === 0 || name.length > 64) return false;
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: name });
    return true;
  } catch {
    return false;
  }
}

const rolloutGroup = section(
  'One rollout group.',
  {
    name: str('The group\'s name, [a-z0-9-]{1,32}: what agents say (their configuration or label) and status shows.', {
      check: (s) => {
        if (!AUTOUPDATE_GROUP_NAME.test(s)) throw new Invalid(`expected a group name of 1 to 32 lowercase letters, digits or -, got ${quote(s.slice(0, 64))}`, 'GW_ERR_AUTOUPDATE_SCHEDULE');
        return s;
      },
    }),
    days: weekdays,
    start_hour: rolloutInt('Local hour (in time_zone) at which the group\'s window opens.', 0, 23, 0),
    time_zone: str('IANA time zone of start_hour and days (Europe/Paris); DST as the zone has it.', {
      default: 'UTC',
      check: (s) => {
        if (!isTimeZone(s)) throw new Invalid(`expected an IANA time zone name such as Europe/Paris, got ${quote(s.slice(0, 64))}`, 'GW_ERR_AUTOUPDATE_TIME_ZONE');
        return s;
      },
    }),
    wait_hours: rolloutInt('halt-on-error: hours after the previous group is done before this one may start.', 0, 24 * 14, 0),
    canary_count: rolloutInt('Agents upgraded first, whose health decides whether the group goes on.', 0, AUTOUPDATE_MAX_CANARIES, 0),
  },
  { required: ['name'], expected: 'a group (a mapping with name, days, start_hour, time_zone, wait_hours, canary_count)' },
);

const rolloutGroups = listOf('The groups, in the order they upgrade (1 to 16).', rolloutGroup, {
  type: 'list of groups',
  expected: 'a list of groups',
  min: 1,
  max: AUTOUPDATE_MAX_GROUPS,
  unique: (g) => g.name ?? '',
});

const autoupdateAgents = section(
  'How agents upgrade.',
  {
    mode: oneOf('enabled: the rollout runs; suspended: nothing new starts; disabled: the seed\'s channels decide.', AUTOUPDATE_MODES, 'enabled'),
    strategy: oneOf('halt-on-error: groups one after the other, each halting on a failed canary; time-based: each group in its own window.', AUTOUPDATE_STRATEGIES, 'halt-on-error'),
    maintenance_window_duration: rolloutDuration('How long a group\'s window stays open.', '1h', 60_000),
    canary_healthy_for: rolloutDuration('How long every canary stays healthy on the target before its group goes on.', '5m', 10_000),
    canary_deadline: rolloutDuration('A canary not healthy on the target this long after it was chosen halts its group.', '30m', 60_000),
    stale_after: rolloutDuration('An agent whose upgrader has not run for this long is listed as stale.', '24h', 60_000),
    catch_all: str('The group of agents in none: a group\'s name, or disabled (they never upgrade). Default: the last group.', {
      check: (s) => {
        if (s !== 'disabled' && !AUTOUPDATE_GROUP_NAME.test(s)) throw new Invalid(`expected a group's name or disabled, got ${quote(s.slice(0, 64))}`, 'GW_ERR_AUTOUPDATE_SCHEDULE');
        return s;
      },
    }),
    schedules: section('The schedules.', { regular: rolloutGroups }, { required: ['regular'] }),
  },
  { required: ['schedules'] },
);

const autoupdateConfigSpec = section(
  'The managed rollout\'s groups and rules.',
  {
    agents: checked(autoupdateAgents, (v, node, path, ctx) => {
      const names = (v.schedules.regular ?? []).map((g) => g.name);
      if (v.catch_all !== undefined && v.catch_all !== 'disabled' && !names.includes(v.catch_all)) {
        ctx.report('GW_ERR_AUTOUPDATE_SCHEDULE', join(path, 'catch_all'), keyOf(node, 'catch_all'), `catch_all names ${quote(v.catch_all)}, which is not one of the groups (${names.join(', ')})`, 'Name one of the groups, or write disabled.');
      }
    }),
  },
  { required: ['agents'] },
);

/** A semantic version, stored without a leading v. */
const rolloutVersion = (doc: string) =>
  str(doc, {
    type: 'version',
    check: (s) => {
      const v = normalizeVersion(s);
      if (v === undefined) throw new Invalid(`expected a version such as 17.0.2, got ${quote(s.slice(0, 64))}`, 'GW_ERR_AUTOUPDATE_VERSION');
      return v.slice(1);
    },
  });

const autoupdateVersionSpec = section(
  'The versions of the managed rollout.',
  {
    agents: section(
      'What agents run.',
      {
        start_version: rolloutVersion('What agents run before the rollout, and go back to on a rollback.'),
        target_version: rolloutVersion('What the rollout installs.'),
        schedule: oneOf('regular: each group in its windows; immediate: windows skipped, canaries still first.', ['regular', 'immediate'] as const, 'regular'),
        mode: oneOf('enabled, suspended (nothing new starts) or disabled (no agent is told to update).', AUTOUPDATE_MODES, 'enabled'),
        critical: leaf<boolean>({
          doc: 'A critical release skips windows (canaries still first).',
          type: 'boolean',
          default: false,
          render: String,
          parse: (node) => {
            if (isScalar(node) && typeof node.value === 'boolean') return node.value;
            throw new Invalid(`expected true or false, got ${describeNode(node)}`, 'GW_ERR_AUTOUPDATE_VERSION');
          },
        }),
      },
      { required: ['start_version', 'target_version'] },
    ),
  },
  { required: ['agents'] },
);

// --- documents ---------------------------------------------------------------------------------------------------

function versionOf(kind: ResourceKind) {
  const supported = RESOURCE_VERSIONS[kind];
  return leaf<string>({
    doc: `Resource version: ${supported}.`,
    type: supported,
    default: supported,
    render: (v) => v,
    parse: (node) => {
      if (!isScalar(node) || typeof node.value !== 'string') {
        throw new Invalid(`expected the version ${supported}, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE', `Write version: ${supported}.`);
      }
      if (node.value !== supported) {
        throw new Invalid(`unsupported version ${describeNode(node)} for kind ${kind}; the supported version is ${supported}`, 'GW_ERR_CONFIG_VALUE', `Write version: ${supported}.`);
      }
      return node.value;
    },
  });
}

function metadataOf(kind: ResourceKind) {
  const nameSpec =
    kind === 'token'
      ? secret('The token itself (secret).', (s) => {
          if (SPACE_OR_CONTROL.test(s)) throw new Invalid('expected a token without spaces or control characters');
          if (s.length > 1024) throw new Invalid('expected a token of at most 1024 characters');
        })
      : isSingleton(kind)
        ? singletonName(kind, SINGLETON_NAMES[kind]!)
        : str(`Name of the ${kind}.`, { check: name(`${kind} name`) });
  return section(
    'Name, description, labels, expiry.',
    {
      name: nameSpec,
      description: str('Free text.'),
      labels: optional(
        mapOf<string | undefined>('Labels of the resource.', {
          type: 'map: label → string',
          key: '<label>',
          checkKey: labelKey,
          value: present(str('A label value.'), 'a string'),
          expected: 'a mapping of labels',
          example: {},
        }),
      ),
      expires: str('When the resource expires (RFC 3339).', { type: 'RFC 3339 time', check: checkRfc3339 }),
    },
    isSingleton(kind) ? {} : { required: ['name'] },
  );
}

/** The one name of a singleton kind: left out, it is that name; any other is refused. */
function singletonName(kind: ResourceKind, only: string) {
  return str(`Always ${only} (a singleton).`, {
    default: only,
    check: (s) => {
      if (s !== only) throw new Invalid(`${kind} is a singleton named ${quote(only)}, got ${quote(s)}`, 'GW_ERR_CONFIG_VALUE', `Leave metadata.name out, or write ${only}.`);
      return s;
    },
  });
}

/** The spec table of each kind, with its own value type (for the check against types.ts at the end). */
const KIND_SPECS = {
  role: roleSpec,
  user: userSpec,
  token: tokenSpec,
  github: githubSpec,
  saml: samlChecked,
  oidc: oidcSpec,
  cluster_maintenance_config: maintenanceSpec,
  lock: lockSpec,
  autoupdate_config: autoupdateConfigSpec,
  autoupdate_version: autoupdateVersionSpec,
};
const SPECS: Record<ResourceKind, Spec<unknown>> = KIND_SPECS;

/** Kinds whose spec (and metadata, version) may be left out. */
const SPEC_OPTIONAL: ReadonlySet<ResourceKind> = new Set(['role', 'user']);

function documentOf(kind: ResourceKind) {
  const singleton = isSingleton(kind);
  return section(
    `A ${kind} resource.`,
    {
      kind: str('The resource kind.'),
      version: versionOf(kind),
      metadata: metadataOf(kind),
      spec: SPECS[kind],
    },
    {
      expected: 'a resource (a mapping with kind, version, metadata and spec)',
      required: singleton ? ['spec'] : SPEC_OPTIONAL.has(kind) ? ['version', 'metadata'] : ['version', 'metadata', 'spec'],
      ...(kind === 'lock' ? { check: lockExpiryInSpec } : {}),
    },
  );
}

/** A lock ends at spec.expires (as in Teleport); metadata.expires would be a second, conflicting expiry. */
function lockExpiryInSpec(value: { metadata?: { expires?: string } }, path: string, ctx: Ctx, at: Node | undefined): void {
  if (value.metadata?.expires === undefined || at === undefined) return;
  const metadata = isMap(at) ? at.items.find((p) => isScalar(p.key) && p.key.value === 'metadata')?.value : undefined;
  const where = isNode(metadata) ? keyOf(metadata, 'expires') : at;
  ctx.report('GW_ERR_CONFIG_VALUE', join(path, 'metadata.expires'), where, 'a lock expires at spec.expires, not metadata.expires', 'Move the time to spec.expires.');
}

/** The table of each kind: a section with kind, version, metadata and spec. */
export const DOCUMENTS = Object.fromEntries(RESOURCE_KINDS.map((k) => [k, documentOf(k)])) as Record<ResourceKind, ReturnType<typeof documentOf>>;

/** Field name → where it belongs, per kind, for "belongs under" hints. */
export const KEY_INDEXES = Object.fromEntries(RESOURCE_KINDS.map((k) => [k, keyIndex(DOCUMENTS[k] as AnySpec)])) as Record<
  ResourceKind,
  Map<string, string[]>
>;

// --- the tables against types.ts ---------------------------------------------------------------------------------

/**
 * A value type as a shape: every key present, undefined left out, readonly dropped, all the way down. A section's
 * value has every key (undefined when absent) while types.ts writes `key?:`; which keys a manifest must give is the
 * tables' `required` lists, checked when a manifest is read (test/auth/resources.test.ts), not here.
 */
type Shape<T> = T extends readonly (infer E)[] ? Shape<E>[] : T extends object ? { -readonly [K in keyof T]-?: Shape<Exclude<T[K], undefined>> } : T;
/** The same test as the configuration's (src/config/schema.ts): true only for identical types. */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Matches<S extends Spec<unknown>, T> = Equal<Shape<Exclude<Infer<S>, undefined>>, Shape<T>>;

/**
 * Compile-time: the tables read what types.ts declares. A key in one and not the other, or of another type (a
 * string for a number, a string for one of a vocabulary's words), names the kind in a tsc error here.
 */
type Mismatched = { [K in ResourceKind]: Matches<(typeof KIND_SPECS)[K], Extract<AnyResource, { kind: K }>['spec']> extends true ? never : K }[ResourceKind];
const specsMatchTypes: [Mismatched] extends [never] ? true : { specOfKindDiffersFromTypesTs: Mismatched } = true;
const metadataMatchesType: Matches<ReturnType<typeof metadataOf>, Metadata> = true;
void specsMatchTypes;
void metadataMatchesType;
