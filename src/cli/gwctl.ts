#!/usr/bin/env node
// Admin CLI: cluster status, join tokens, users, and resources (roles, connectors, cluster_maintenance_config).
import { fchmodSync, fstatSync, readFileSync } from 'node:fs';
import { writeSecretFile } from '../fsutil.js';
import type { Resource } from '../auth/resources/index.js';
import { DEFAULT_APPLY_SET, getKindOf, hasChanges, planText, toJson, toYaml, type ApplyResult } from '../auth/resources/index.js';
import { readApplyFiles } from './apply.js';
import { addAutoupdateCommands } from './autoupdate.js';
import type { ApiClient } from '../client/api.js';
import { formatDuration, parseDuration } from '../duration.js';
import { GatewayError } from '../errors.js';
import { gwctlClient, gwctlProxyClient, type CredentialOptions } from './credentials.js';
import { readPassword } from './prompt.js';
import { newProgram, runCli } from './run.js';
import { addCompletionCommands } from './completion.js';
import { PROXY_ENVIRONMENT } from './manpage.js';
import { FORMATS, formatOf, formatOption, render, type FormatOptions, type FormatSpec } from './output.js';
import { resourceTable } from './resources.js';
import { table } from './table.js';

const program = newProgram('gwctl', 'Admin CLI: manage users, roles, tokens and cluster resources.')
  .option('--auth-server <host:port>', "the Auth Service's API address (uses the local admin identity of --data-dir)")
  .option('-d, --data-dir <dir>', "the Auth Service's data directory, for its local admin identity (default: /var/lib/gateway for root, ~/.local/state/gateway for other users)")
  .option('-c, --config <file>', "the gateway configuration file, to find the data directory");

const client = (): ApiClient => gwctlClient(program.opts<CredentialOptions>());
const out = (text: string): void => void process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);

function list(value: string): string[] {
  return value
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}

/** GET /v1/status: the service, and for callers who may list Proxies, the Proxies and their channel drift (src/auth/drift.ts). */
interface StatusAnswer {
  cluster_name: string;
  version: string;
  ca_pin: string;
  identity: { kind: string; name: string; roles: string[] };
  proxies?: Array<{ id: string; nodename: string; version: string; public_addr: string; channels_digest: string }>;
  channel_drift?: { agree: boolean; channels: Array<{ channel: string; values: Array<{ value: string; proxies: Array<{ id: string; nodename: string }> }> }> };
}

/** The Proxies and the channel drift section of `gwctl status` (nothing when the caller may not list Proxies). */
function proxyStatusLines(s: StatusAnswer): string[] {
  if (!s.proxies) return [];
  const lines = ['', `Proxies: ${s.proxies.length}`];
  if (s.proxies.length > 0) {
    lines.push(table([['ID', 'Nodename', 'Version', 'Public address', 'Channels'], ...s.proxies.map((p) => [p.id, p.nodename, p.version, p.public_addr, p.channels_digest.slice(0, 12)])]));
  }
  const drift = s.channel_drift;
  if (!drift || drift.agree) {
    lines.push('Upgrade channels: every Proxy serves the same automatic_upgrades_channels');
    return lines;
  }
  lines.push('Upgrade channels: DRIFT: the Proxies serve different automatic_upgrades_channels (agents may flip versions)');
  for (const c of drift.channels) {
    lines.push(`  ${c.channel}:`);
    for (const v of c.values) lines.push(`    ${v.value} on ${v.proxies.map((p) => `${p.nodename} (${p.id})`).join(', ')}`);
  }
  lines.push('  hint: give every Proxy the same proxy_service.automatic_upgrades_channels and reload them (SIGHUP)');
  return lines;
}

formatOption(program
  .command('status')
  .description('print the cluster name, version, CA pin, the Proxies and whether their upgrade channels agree; fails when the credentials do not work'))
  .action(async (opts: FormatOptions) => {
    const format = formatOf(opts);
    const s = await client().call<StatusAnswer>('GET', '/v1/status');
    if (format !== 'text') return out(render(format, s, () => ''));
    out(table([
      ['Cluster:', s.cluster_name],
      ['Version:', s.version],
      ['CA pin:', s.ca_pin],
      ['Identity:', s.identity.kind === 'admin' ? 'local admin (full permissions)' : `${s.identity.name} (roles: ${s.identity.roles.join(', ') || 'none'})`],
    ]));
    const more = proxyStatusLines(s);
    if (more.length > 0) out(more.join('\n'));
  });

formatOption(program
  .command('probe <kind> <name>')
  .description('send a canary to a resource (kind: node, db, app, kube, desktop) through the Proxy, a peer Proxy, the tunnel and the agent, and print each hop\'s time; the agent only connects to the resource, no data passes')
  .option('--proxy <host:port>', "the Proxy's web address to probe from (needed with the local admin identity; default: the signed-in Proxy)"))
  .action(async (kind: string, name: string, opts: FormatOptions & { proxy?: string }) => {
    const format = formatOf(opts);
    const api = gwctlProxyClient(program.opts<CredentialOptions>(), opts.proxy);
    const r = await api.call<ProbeAnswer>('GET', `/v1/probe?kind=${encodeURIComponent(kind)}&name=${encodeURIComponent(name)}`);
    if (format !== 'text') return out(render(format, r, () => ''));
    out(`${r.kind} "${r.resource}" answered through agent "${r.agent}" (${r.via}) in ${ms(r.total_ms)}`);
    out(table([['HOP', 'TIME', ''], ...r.hops.map((h) => [h.hop, ms(h.ms), h.detail ?? ''])]));
  });

/** What GET /v1/probe answers (src/proxy/probe.ts ProbeResult). */
interface ProbeAnswer {
  kind: string;
  resource: string;
  agent: string;
  via: string;
  hops: Array<{ hop: string; ms: number; detail?: string }>;
  total_ms: number;
}

const ms = (v: number): string => `${v < 10 ? v.toFixed(2) : v.toFixed(1)} ms`;

/** What the printed agent command uses: the configuration file and a data directory apart from the Proxy's. */
const AGENT_CONFIG = '/etc/gateway.yaml';
const AGENT_DATA_DIR = '/var/lib/gateway-agent';
/** And for a Proxy that runs without the Auth Service in its process. */
const PROXY_DATA_DIR = '/var/lib/gateway-proxy';

addAutoupdateCommands(program, client, out);

const tokens = program.command('tokens').description('join tokens for agents');
formatOption(tokens
  .command('add')
  .description('create a join token and print it with the CA pin and a ready start command')
  .requiredOption('--type <types>', 'comma-separated: node, db, app, kube, desktop, proxy')
  .option('--ttl <duration>', 'how long the token is valid', '30m')
  .option('--uses <n>', 'how many agents may join with it (0 = any number until it expires)', '1'))
  .action(async (opts: { type: string; ttl: string; uses: string } & FormatOptions) => {
    const format = formatOf(opts);
    const ttlMs = parseDuration(opts.ttl, '--ttl');
    if (!/^\d+$/.test(opts.uses)) throw new GatewayError('GW_ERR_USAGE', `--uses: "${opts.uses}" is not a whole number`);
    const c = client();
    const created = await c.call<{ token: string; id: string; expiresAt: string; roles: string[] }>('POST', '/v1/tokens', { roles: list(opts.type), ttl_ms: ttlMs, uses: Number(opts.uses) });
    const status = await c.call<{ ca_pin: string; proxy_public_addr?: string }>('GET', '/v1/status');
    const proxy = status.proxy_public_addr ?? '<proxy-host>:443';
    // Complete and safe as printed: the agent's own configuration file (its resources) and a data directory of its
    // own, so that run on the Proxy's machine it can never take the Proxy's (the data-dir lock would refuse it).
    // A Proxy joins at the Auth API itself (it runs there without the Auth Service in its process): the address gwctl
    // used when it is the Auth API, else a placeholder to fill in.
    const forProxy = created.roles.includes('proxy');
    const authAddr = c.server === 'auth' && !/^(127\.|\[?::1\]?:|localhost:)/.test(c.address) ? c.address : '<auth-host>:3025';
    const command = forProxy
      ? `gateway start --data-dir=${PROXY_DATA_DIR} --roles=${created.roles.join(',')} --auth-server=${authAddr} --token=${created.token} --ca-pin=${status.ca_pin}`
      : `gateway start -c ${AGENT_CONFIG} --data-dir=${AGENT_DATA_DIR} --roles=${created.roles.join(',')} --token=${created.token} --ca-pin=${status.ca_pin} --proxy=${proxy}`;
    if (format !== 'text') return out(render(format, { token: created.token, id: created.id, roles: created.roles, expires: created.expiresAt, ca_pin: status.ca_pin, command }, () => ''));
    out(
      [
        `The invite token: ${created.token}`,
        `This token will expire in ${formatDuration(ttlMs)} (${created.expiresAt}) and can be used ${opts.uses === '0' ? 'any number of times' : `${opts.uses} time(s)`}.`,
        `CA pin: ${status.ca_pin}`,
        '',
        forProxy
          ? `Run this on the new Proxy (add -c FILE for its proxy_service settings; gateway.auth_server may list every Auth Service):`
          : `Run this on the new agent, once ${AGENT_CONFIG} lists its resources ('gateway configure' prints every key):`,
        '',
        `  ${command}`,
        '',
        'Keep the token secret: whoever holds it can join the cluster until it expires.',
      ].join('\n'),
    );
  });
formatOption(tokens
  .command('ls')
  .description('list join tokens (their ids; token values are never stored)'))
  .action(async (opts: FormatOptions) => {
    const format = formatOf(opts);
    const { tokens: listed } = await client().call<{ tokens: Array<{ id: string; roles: string[]; expires: string; uses: number; used: number; createdAt?: string; createdBy?: string }> }>('GET', '/v1/tokens');
    // The API's answer (the Web UI's too) names two fields in camelCase; what gwctl prints is snake_case.
    const rows = listed.map(({ createdAt, createdBy, ...t }) => ({ ...t, ...(createdAt === undefined ? {} : { created_at: createdAt }), ...(createdBy === undefined ? {} : { created_by: createdBy }) }));
    out(render(format, rows, () => table([['Id', 'Types', 'Uses', 'Expires'], ...rows.map((t) => [t.id, t.roles.join(','), t.uses === 0 ? `${t.used}/any` : `${t.used}/${t.uses}`, t.expires])])));
  });
tokens
  .command('rm')
  .description('remove a join token, given its value or its id')
  .argument('<token>')
  .action(async (token: string) => {
    await client().call('DELETE', `/v1/tokens/${encodeURIComponent(token)}`);
    out('token removed');
  });

const users = program.command('users').description('local users');
users
  .command('add')
  .description('create a user; the password is read from standard input, or prompted twice on a terminal')
  .argument('<user>')
  .requiredOption('--roles <roles>', 'comma-separated role names')
  .option('--logins <logins>', 'OS logins for this user (the trait {{internal.logins}} in roles such as access)')
  .option('--db-users <users>', 'database users this user may connect as (the trait {{internal.db_users}} in roles such as access)')
  .option('--db-names <names>', 'database names this user may connect to (the trait {{internal.db_names}} in roles such as access)')
  .option('--kubernetes-users <users>', 'Kubernetes users the gateway may impersonate for this user (the trait {{internal.kubernetes_users}} in roles such as access)')
  .option('--kubernetes-groups <groups>', 'Kubernetes groups the gateway impersonates for this user (the trait {{internal.kubernetes_groups}} in roles such as access)')
  .action(async (user: string, opts: { roles: string; logins?: string; dbUsers?: string; dbNames?: string; kubernetesUsers?: string; kubernetesGroups?: string }) => {
    const password = await readPassword(`Password for ${user}: `, { confirm: true });
    await client().call('POST', '/v1/users', {
      name: user,
      roles: list(opts.roles),
      password,
      ...(opts.logins ? { logins: list(opts.logins) } : {}),
      ...(opts.dbUsers ? { db_users: list(opts.dbUsers) } : {}),
      ...(opts.dbNames ? { db_names: list(opts.dbNames) } : {}),
      ...(opts.kubernetesUsers ? { kubernetes_users: list(opts.kubernetesUsers) } : {}),
      ...(opts.kubernetesGroups ? { kubernetes_groups: list(opts.kubernetesGroups) } : {}),
    });
    out(`user "${user}" has been created with roles ${list(opts.roles).join(', ')}`);
  });
users
  .command('update')
  .description("set a user's roles (takes effect when the user signs in again)")
  .argument('<user>')
  .requiredOption('--set-roles <roles>', 'comma-separated role names')
  .action(async (user: string, opts: { setRoles: string }) => {
    await client().call('PUT', `/v1/users/${encodeURIComponent(user)}/roles`, { roles: list(opts.setRoles) });
    out(`user "${user}" now has roles ${list(opts.setRoles).join(', ')}; a role taken away stops working at once, a role given works after 'gwsh logout' and 'gwsh login'`);
  });
formatOption(users
  .command('ls')
  .description('list users'))
  .action(async (opts: FormatOptions) => {
    const format = formatOf(opts);
    const { users: rows } = await client().call<{ users: Array<{ metadata: { name: string }; spec: { roles: string[] } }> }>('GET', '/v1/users');
    out(render(format, rows, () => table([['User', 'Roles'], ...rows.map((u) => [u.metadata.name, u.spec.roles.join(',')])])));
  });
users
  .command('rm')
  .description('remove a user: every certificate of the user is refused at once, and what it has open is closed')
  .argument('<user>')
  .action(async (user: string) => {
    await client().call('DELETE', `/v1/users/${encodeURIComponent(user)}`);
    out(`user "${user}" has been removed`);
  });

program
  .command('create')
  .description('create the resources of a YAML manifest (several documents allowed); all or nothing')
  .argument('<file>', 'manifest file, or - for standard input')
  .option('-f, --force', 'create or overwrite')
  .action(async (file: string, opts: { force?: boolean }) => {
    let manifest: string;
    try {
      manifest = file === '-' ? readFileSync(0, 'utf8') : readFileSync(file, 'utf8');
    } catch (err) {
      throw new GatewayError('GW_ERR_USAGE', `cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`, {
        hint: 'Check the path of the manifest and that this user can read it (or give - and pipe it on standard input).',
        details: { path: file },
      });
    }
    const { messages } = await client().call<{ messages: string[] }>('POST', '/v1/resources', { manifest, source: file, overwrite: opts.force === true });
    for (const m of messages) out(m);
  });

/** gwctl apply --exit-code: the plan has changes (0 none, 1 an error, 2 a usage error, as every CLI here). */
const EXIT_CHANGES = 3;
const APPLY_FORMAT: FormatSpec = { shortFlag: false };

formatOption(program
  .command('apply')
  .description('make the resources of manifests (files or directories) what is stored: prints the plan (create, update with a diff, unchanged, delete), then applies it in one write; all or nothing')
  .requiredOption('-f, --filename <path>', 'a manifest file (.yaml, .yml, .json), a directory of them, or - for standard input; may be repeated', (v: string, prev: string[] | undefined) => [...(prev ?? []), v])
  .option('-R, --recursive', 'read the subdirectories of a directory too')
  .option('--dry-run', 'print the plan and change nothing')
  .option('--exit-code', `exit with status ${EXIT_CHANGES} when the plan has changes (with --dry-run: changes pending; as terraform plan -detailed-exitcode)`)
  .option('--prune', 'delete the resources of the apply set that the files no longer hold (never presets, never resources made by hand)')
  .option('--set <name>', 'the apply set: the label gateway.dev/apply-set on every resource applied, and what --prune considers', DEFAULT_APPLY_SET)
  .option('--no-diff', 'print the plan without the diffs of updates'), APPLY_FORMAT)
  .action(async (opts: { filename: string[]; recursive?: boolean; dryRun?: boolean; exitCode?: boolean; prune?: boolean; set: string; diff: boolean } & FormatOptions) => {
    const format = formatOf(opts, APPLY_FORMAT);
    const files = readApplyFiles(opts.filename, opts.recursive === true);
    const result = await client().call<ApplyResult>('POST', '/v1/resources/apply', { files, dry_run: opts.dryRun === true, prune: opts.prune === true, set: opts.set });
    out(render(format, result, () => `${planText(result, opts.diff)}\n${result.dry_run ? 'Dry run: nothing was changed.' : hasChanges(result) ? 'Applied.' : 'Nothing to change.'}`));
    if (opts.exitCode && hasChanges(result)) process.exitCode = EXIT_CHANGES;
  });

/** gwctl get prints YAML unless told (as upstream's tctl get does): what it prints, gwctl create reads back. */
const GET_FORMAT: FormatSpec = { default: 'yaml', aliases: { table: 'text' } };

/** KIND, KIND/NAME or KIND NAME: the kind as the user wrote it (singular or plural) and the name, if any. */
function resourceRef(ref: string, second: string | undefined): { kind: string; name: string | undefined } {
  const slash = ref.indexOf('/');
  if (slash >= 0 && second !== undefined) throw new GatewayError('GW_ERR_USAGE', `give KIND/NAME or KIND NAME, not both ("${ref}" and "${second}")`);
  if (slash < 0) return { kind: ref, name: second };
  if (slash === 0 || slash === ref.length - 1) throw new GatewayError('GW_ERR_USAGE', `"${ref}" is not KIND/NAME`);
  return { kind: ref.slice(0, slash), name: ref.slice(slash + 1) };
}

formatOption(program
  .command('get')
  .description('print resources: KIND (all of them), KIND NAME or KIND/NAME; text tables, or yaml (the default, which gwctl create reads back) and json')
  .argument('<kind>', 'role, user, token, github, saml, oidc, cluster_maintenance_config, lock, autoupdate_config, autoupdate_version, autoupdate_agent_rollout, node, proxy, event (singular or plural), or KIND/NAME')
  .argument('[name]', 'one resource of the kind')
  .option('--with-secrets', "include secrets such as a connector's signing_key_pair.private_key")
  .option('-o, --output <file>', 'write to this file (mode 0600, replaced atomically) instead of standard output'), GET_FORMAT)
  .action(async (ref: string, second: string | undefined, opts: { withSecrets?: boolean; output?: string } & FormatOptions) => {
    const format = formatOf(opts, GET_FORMAT);
    if (opts.output !== undefined && (FORMATS as readonly string[]).includes(opts.output)) {
      // kubectl's -o is the format; here it is a file, and "-o json" would quietly write one named json.
      throw new GatewayError('GW_ERR_USAGE', `-o ${opts.output} writes to a file named "${opts.output}"; the output format is -f (--format)`, {
        hint: `Give -f ${opts.output} for the format, or -o ./${opts.output} if you do want a file of that name.`,
      });
    }
    const { kind, name } = resourceRef(ref, second);
    const path = `/v1/resources/${encodeURIComponent(kind)}${name === undefined ? '' : `/${encodeURIComponent(name)}`}${opts.withSecrets ? '?with_secrets=1' : ''}`;
    const { resources } = await client().call<{ resources: Resource[] }>('GET', path);
    const text = format === 'json' ? toJson(resources) : format === 'text' ? resourceTable(getKindOf(kind) ?? kind, resources) : toYaml(resources);
    if (opts.output !== undefined) {
      writeSecretFile(opts.output, text.endsWith('\n') ? text : `${text}\n`);
    } else {
      // Redirected to a file (`> file`): the shell created it with the umask's mode; secrets make it private.
      if (opts.withSecrets) tightenStdoutFile();
      out(text);
    }
    if (opts.withSecrets) {
      process.stderr.write('warning: this output contains secrets (private keys); delete any file you saved it to once you are done with it.\n');
    }
  });

/** When standard output is a regular file, make it readable by its owner only (0600). */
function tightenStdoutFile(): void {
  try {
    if (fstatSync(1).isFile()) fchmodSync(1, 0o600);
  } catch {
    // not ours to change (another user's file, or no file at all): the warning below still applies
  }
}

interface TargetOptions {
  user?: string;
  role?: string;
  node?: string;
}

/** The one target of --user, --role, --node (a usage error unless exactly one is given). */
function targetOption(opts: TargetOptions, command: string): Record<string, string> {
  const given = (['user', 'role', 'node'] as const).filter((k) => opts[k] !== undefined);
  if (given.length !== 1) {
    throw new GatewayError('GW_ERR_USAGE', `${command} needs exactly one of --user, --role, --node${given.length > 1 ? ` (got ${given.map((k) => `--${k}`).join(' and ')})` : ''}`, {
      hint: `One target per lock: gwctl ${command} --user bob, --role contractor or --node <host ID from 'gwctl get nodes'>.`,
    });
  }
  return { [given[0]!]: opts[given[0]!]! };
}

formatOption(program
  .command('lock')
  .description('lock a user, a role (every user holding it), an agent or a Proxy: refused at once, and what it has open is closed')
  .option('--user <name>', 'lock this user')
  .option('--role <name>', 'lock every user holding this role')
  .option('--node <host-id>', "lock this agent or Proxy (its host ID, from 'gwctl get nodes' or 'gwctl get proxies'): its tunnels, event stream and peering are dropped and refused")
  .option('--message <text>', 'shown with every refusal')
  .option('--ttl <duration>', 'the lock ends by itself after this long (90s, 30m, 12h, 7d)')
  .option('--expires <time>', 'the lock ends by itself at this RFC 3339 time (2030-01-31T23:59:59Z)')
  .option('--name <name>', 'the lock name (default: a generated UUID)'))
  .action(async (opts: TargetOptions & { message?: string; ttl?: string; expires?: string; name?: string } & FormatOptions) => {
    const format = formatOf(opts);
    const target = targetOption(opts, 'lock');
    if (opts.ttl !== undefined && opts.expires !== undefined) throw new GatewayError('GW_ERR_USAGE', 'give --ttl or --expires, not both');
    if (opts.expires !== undefined && Number.isNaN(Date.parse(opts.expires))) {
      throw new GatewayError('GW_ERR_USAGE', `--expires: "${opts.expires}" is not an RFC 3339 time`, { hint: 'Write it like 2030-01-31T23:59:59Z.' });
    }
    const body = {
      target,
      ...(opts.message ? { message: opts.message } : {}),
      ...(opts.ttl === undefined ? {} : { ttl_ms: parseDuration(opts.ttl, '--ttl') }),
      ...(opts.expires === undefined ? {} : { expires: opts.expires }),
      ...(opts.name ? { name: opts.name } : {}),
    };
    const { lock } = await client().call<{ lock: { metadata: { name: string }; spec: { expires?: string } } }>('POST', '/v1/locks', body);
    if (format !== 'text') return out(render(format, lock, () => ''));
    const [kind, value] = Object.entries(target)[0]!;
    out(`lock "${lock.metadata.name}" created: ${kind} ${value} is locked ${lock.spec.expires ? `until ${lock.spec.expires}` : "until 'gwctl unlock' removes it"}`);
  });

program
  .command('unlock')
  .description('remove a lock by name, or every lock on a user, a role or an agent')
  .argument('[name]', "the lock's name ('gwctl get locks')")
  .option('--user <name>', 'remove every lock on this user')
  .option('--role <name>', 'remove every lock on this role')
  .option('--node <host-id>', 'remove every lock on this agent')
  .action(async (name: string | undefined, opts: TargetOptions) => {
    let path: string;
    if (name !== undefined) {
      if (opts.user ?? opts.role ?? opts.node) throw new GatewayError('GW_ERR_USAGE', 'give a lock name or one of --user, --role, --node, not both');
      path = `/v1/locks/${encodeURIComponent(name)}`;
    } else {
      path = `/v1/locks?${new URLSearchParams(targetOption(opts, 'unlock')).toString()}`;
    }
    const { removed } = await client().call<{ removed: string[] }>('DELETE', path);
    for (const n of removed) out(`lock "${n}" has been removed`);
  });

program
  .command('rm')
  .description('remove a resource')
  .argument('<ref>', 'KIND/NAME')
  .action(async (ref: string) => {
    const slash = ref.indexOf('/');
    if (slash < 1 || slash === ref.length - 1) throw new GatewayError('GW_ERR_USAGE', `"${ref}" is not KIND/NAME`);
    await client().call('DELETE', `/v1/resources/${encodeURIComponent(ref.slice(0, slash))}/${encodeURIComponent(ref.slice(slash + 1))}`);
    out(`${ref} has been removed`);
  });

addCompletionCommands(program, {
  description: ["It acts with the Auth Service's local admin identity (--data-dir, or the configuration's data directory) or, with --auth-server, over the Auth API; docs/cli.md lists the commands with examples."],
  environment: PROXY_ENVIRONMENT,
  files: [
    ['/var/lib/gateway/admin', 'The local admin identity of an Auth Service run by root (~/.local/state/gateway for other users).'],
    ['/etc/gateway.yaml', 'The configuration read with -c, for its data directory.'],
  ],
  seeAlso: ['gateway(1)', 'gwsh(1)'],
});

await runCli(program);
