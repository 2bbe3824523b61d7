#!/usr/bin/env node
// Client CLI: sign in to a cluster through its Proxy and show the profile.
import http from 'node:http';
import { generateKeyPair, identityFromCert } from '../auth/pki.js';
import { randomSecret, sameSecret, sha256hex } from '../wire/secrets.js';
import type { CertBundle } from '../wire/certs.js';
import { ApiClient, fetchPinnedCas, normalizeAddress } from '../client/api.js';
import { checkNotExpired, knownCa, loadProfile, profileDir, removeProfile, saveProfile } from '../client/profile.js';
import { parseDuration } from '../duration.js';
import { writeSecretFile } from '../fsutil.js';
import net from 'node:net';
import { readFileSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { userInfo } from 'node:os';
import { spawn as spawnChild } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { parseSshCert } from '../auth/pki.js';
import { Dialer } from '../dial/dialer.js';
import { fetchPing, openResource, resourceTlsContext, routeAddress, type ResourceTarget } from '../client/resources.js';
import { E2E_ENV, E2EStreams, e2eModeOf, KUBE_ROUTE, type E2EMode } from '../client/e2e.js';
import { splice } from '../stream/splice.js';
import { endedCleanly, resetStream } from '../stream/reset.js';
import { isErrorCode, toGatewayError } from '../errors.js';
import { GatewayError } from '../errors.js';
import { databaseRoute, GRANT_ALPN } from '../wire/protocols.js';
import { readPassword } from './prompt.js';
import { newProgram, runCli } from './run.js';
import type { Command } from 'commander';
import { positionalOptions } from './cmdtree.js';
import { addCompletionCommands } from './completion.js';
import { PROXY_ENVIRONMENT } from './manpage.js';
import { formatOf, formatOption, render, type Format, type FormatOptions } from './output.js';
import { table } from './table.js';
import { addKubeLogin, checkKubeCluster, kubeProxyStarted } from './kubelogin.js';
import { kubeClassicOpener, kubeRefusal, kubeRoute } from '../client/kubeproxy.js';
import type { PingResponse } from '../wire/ping.js';
import type { Duplex } from 'node:stream';
import { startTracing, stopTracing, tracingSettings } from '../trace.js';

const program = positionalOptions(newProgram('gwsh', 'Client CLI: log in and reach servers, databases, apps and clusters through the gateway.'));

formatOption(program
  .command('login')
  .description('sign in and receive short-lived certificates (password from the terminal or standard input, or --auth=CONNECTOR through the browser)')
  .requiredOption('--proxy <host:port>', "the Proxy's public web address")
  .option('--user <user>', 'user name (a local user; not with --auth)')
  .option('--auth <connector>', 'sign in through a single sign-on connector (oidc, saml or github; kind/name if names repeat): prints the URL to open')
  .option('--ca-pin <pin>', "the cluster's CA pin (sha256:...), to trust a cluster whose certificate is not publicly trusted")
  .option('--ttl <duration>', 'certificate lifetime (at most what the cluster allows, 12h by default; with --auth the session\'s)'))
  .action(async (opts: { proxy: string; user?: string; auth?: string; caPin?: string; ttl?: string } & FormatOptions) => {
    // What login prints is the profile, as gwsh status prints it.
    const format = formatOf(opts);
    const proxy = normalizeAddress(opts.proxy);
    if (!opts.auth && !opts.user) throw new GatewayError('GW_ERR_USAGE', 'give --user for a local user, or --auth=CONNECTOR to sign in through single sign-on');
    if (opts.auth && opts.user) throw new GatewayError('GW_ERR_USAGE', '--user and --auth exclude each other: the identity provider names the user');
    const ttlMs = opts.ttl ? parseDuration(opts.ttl, '--ttl') : undefined;
    // Trust: a pinned cluster CA, else the CA kept for this proxy address by an earlier login (also across a
    // logout), else the system's CAs.
    const previous = loadProfile();
    const kept = knownCa(profileDir(), proxy)?.host_ca ?? (previous?.proxy === proxy ? previous.hostCa : undefined);
    const ca = opts.caPin ? (await fetchPinnedCas(proxy, opts.caPin)).host_ca : kept;
    const client = new ApiClient({ address: proxy, ...(ca ? { ca } : {}) });
    const keys = generateKeyPair();
    if (opts.auth) {
      // The URL to open is for the person: on standard error when standard output is data.
      const bundle = await ssoLogin(client, opts.auth, keys, format === 'text' ? process.stdout : process.stderr);
      saveProfile(profileDir(), proxy, identityFromCert(bundle.tlsCert).name, keys.privateKeyPem, bundle);
      printStatus(format);
      return;
    }
    const password = await readPassword(`Enter password for ${opts.user}: `);
    const bundle = await client.call<CertBundle>('POST', '/webapi/login', {
      username: opts.user,
      password,
      public_key: keys.publicKeyPem,
      ssh_public_key: keys.sshPublicKey,
      ...(ttlMs === undefined ? {} : { ttl_ms: ttlMs }),
    });
    saveProfile(profileDir(), proxy, opts.user!, keys.privateKeyPem, bundle);
    printStatus(format);
  });

/** How long gwsh waits for the browser to come back from the identity provider (GWSH_SSO_TIMEOUT_MS overrides). */
const SSO_CALLBACK_MS = 3 * 60_000;

/**
 * gwsh login --auth: a listener on 127.0.0.1 for the browser's return, the URL to open printed, the one-time code
 * from the callback exchanged (with a secret that never left this process) for certificates. The callback URL
 * carries a state of this process's: only a request that brings it back is the sign-in's.
 */
async function ssoLogin(client: ApiClient, connector: string, keys: ReturnType<typeof generateKeyPair>, say: NodeJS.WritableStream): Promise<CertBundle> {
  const secret = randomSecret();
  const callback = await loopbackCallback(Number(process.env.GWSH_SSO_TIMEOUT_MS) || SSO_CALLBACK_MS);
  try {
    const started = await client.call<{ auth_url: string; request_id: string }>('POST', '/webapi/sso/console', {
      connector,
      public_key: keys.publicKeyPem,
      ssh_public_key: keys.sshPublicKey,
      redirect_url: callback.url,
      secret_hash: sha256hex(secret),
    });
    say.write(`Open this URL in your browser: ${started.auth_url}\n`);
    const code = await callback.code;
    return await client.call<CertBundle>('POST', '/webapi/sso/console/exchange', { request_id: started.request_id, code, secret });
  } finally {
    callback.close();
  }
}

/**
 * Listens on 127.0.0.1:<random> for GET /callback?state=<ours>&code=...: the first request with our state ends it,
 * or the deadline does. Any page the browser opens can send requests here: one without our state is answered 400
 * and changes nothing, so it cannot end or break the sign-in.
 */
async function loopbackCallback(deadlineMs: number): Promise<{ url: string; code: Promise<string>; close(): void }> {
  const state = randomSecret();
  const stateHash = sha256hex(state);
  let settle!: { resolve: (code: string) => void; reject: (err: Error) => void };
  const code = new Promise<string>((resolve, reject) => (settle = { resolve, reject }));
  let warned = false;
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://127.0.0.1');
    const value = url.searchParams.get('code');
    if (req.method !== 'GET' || url.pathname !== '/callback' || !value || value.length > 256) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
      return;
    }
    if (!sameSecret(url.searchParams.get('state') ?? '', stateHash)) {
      res.writeHead(400, { 'content-type': 'text/plain', 'cache-control': 'no-store' }).end('this is not the sign-in gwsh is waiting for\n');
      if (!warned) process.stderr.write('gwsh: ignored a callback without this sign-in\'s state (another page or an older sign-in); still waiting\n');
      warned = true;
      return;
    }
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store', connection: 'close' })
      .end('<!doctype html><title>Signed in</title><p>Signed in: you may close this window and go back to the terminal.</p>');
    settle.resolve(value);
  });
  server.headersTimeout = 10_000;
  server.requestTimeout = 10_000;
  server.maxHeadersCount = 64;
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const timer = setTimeout(() => settle.reject(new GatewayError('GW_ERR_SSO_STATE_INVALID', `the browser did not come back from the identity provider within ${Math.round(deadlineMs / 1000)} s`, {
    hint: 'Run gwsh login --auth again and finish the sign-in in the browser in time.',
  })), deadlineMs);
  const close = () => {
    clearTimeout(timer);
    server.close();
    server.closeAllConnections();
  };
  return { url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/callback?state=${state}`, code, close };
}

formatOption(program
  .command('status')
  .description("print the current profile: user, roles (as the certificate carries them), cluster, validity"))
  .action((opts: FormatOptions) => {
    printStatus(formatOf(opts));
  });

program
  .command('logout')
  .description("remove the profile, its keys and certificates (the cluster's CA stays trusted for the next login)")
  .action(() => {
    let profile: ReturnType<typeof loadProfile>;
    try {
      profile = loadProfile();
    } catch {
      profile = undefined; // a damaged profile is removed all the same
    }
    const had = removeProfile();
    if (!had) process.stdout.write('not logged in\n');
    else if (profile && knownCa(profileDir(), profile.proxy)) process.stdout.write(`logged out; the CA of cluster ${profile.cluster} stays trusted for ${profile.proxy}\n`);
    else process.stdout.write('logged out\n');
  });

/** The signed-in profile, its certificate still valid (GW_ERR_CLIENT_CERT_EXPIRED otherwise: before any connection). */
function requireProfile() {
  const profile = loadProfile();
  if (!profile) throw new GatewayError('GW_ERR_CLIENT_NOT_LOGGED_IN', 'not logged in', { hint: "Run 'gwsh login --proxy=HOST:PORT --user=USER'." });
  checkNotExpired(profile);
  return profile;
}

function apiFor(profile: ReturnType<typeof requireProfile>): ApiClient {
  return new ApiClient({ address: profile.proxy, ca: profile.hostCa, cert: profile.cert, key: profile.key });
}

interface InventoryItem {
  name: string;
  labels: Record<string, string>;
  agent: string;
  connected_since: string;
  protocol?: string;
  public_addr?: string;
}

function printInventory(items: InventoryItem[], format: Format, withProtocol: string): void {
  const rows = () => [['Name', withProtocol, 'Labels', 'Agent', 'Connected since'], ...items.map((i) => [i.name, i.protocol ?? '', Object.entries(i.labels).map(([k, v]) => `${k}=${v}`).join(','), i.agent, i.connected_since])];
  process.stdout.write(render(format, items, () => table(rows())));
}

for (const [name, kind, column, description] of [
  ['db', 'db', 'Protocol', 'databases you may reach'],
  ['apps', 'app', 'Type', 'applications you may reach'],
  ['desktops', 'desktop', '', 'desktops you may reach'],
  ['kube', 'kube', '', 'Kubernetes clusters you may reach'],
  ['ls', 'node', '', 'servers (SSH nodes) you may reach'],
] as const) {
  const cmd = name === 'ls' ? program.command('ls') : program.command(name).command('ls');
  formatOption(cmd.description(`list the ${description}, with their labels, agent and since when connected`))
    .action(async (opts: FormatOptions) => {
      const format = formatOf(opts);
      const { items } = await apiFor(requireProfile()).call<{ items: InventoryItem[] }>('GET', `/v1/inventory/${kind}`);
      printInventory(items, format, column);
    });
}

addKubeLogin(program.commands.find((c) => c.name() === 'kube')!, requireProfile);

/** The --e2e flag of the commands that carry streams (docs/cli.md, "End-to-end streams"). */
const E2E_FLAG = ['--e2e <mode>', `end-to-end encryption with the agent: auto (when the Proxy and the agent can, else the classic route), require (refuse the classic route) or off; default: $${E2E_ENV}, else auto`] as const;

/** gwsh --debug: a line on standard error (the path each connection took). */
function debugLine(line: string): void {
  // As runCli reads it: --debug anywhere on the command line.
  if (process.argv.includes('--debug')) process.stderr.write(`gwsh: ${line}\n`);
}

/** The streams of one command: end-to-end or classic per connection as mode says (src/client/e2e.ts). */
function streamsFor(profile: ReturnType<typeof requireProfile>, dialer: Dialer, ping: Awaited<ReturnType<typeof fetchPing>>, target: ResourceTarget, mode: E2EMode, context?: ReturnType<typeof resourceTlsContext>, classic?: LocalProxyHooks['classic']): E2EStreams {
  return new E2EStreams({
    ...(classic ? { classic } : {}),
    profile,
    dialer,
    mode,
    classicAddress: routeAddress(profile, ping, target.alpn),
    // Grants and end-to-end streams go to the one port (the web address), whatever the listener mode.
    e2eAddress: routeAddress(profile, ping, GRANT_ALPN),
    ...(context ? { secureContext: context } : {}),
    debug: debugLine,
  });
}

/** What a local listener of a route other than the resource routes (gwsh proxy kube) does its own way. */
interface LocalProxyHooks {
  /** Checks before listening, in place of asking the Proxy with the route header's check. */
  check: (ping: PingResponse, dialer: Dialer, context: ReturnType<typeof resourceTlsContext>) => Promise<void>;
  /** The classic route's connection (E2EStreams' classic). */
  classic: (target: ResourceTarget) => Promise<Duplex>;
  /** What is printed once listening on port, after the line every listener prints. */
  started: (port: number) => string;
  /** A connection that gets no stream, answered in the client's protocol (default: reset). */
  refuse?: (local: net.Socket, e: GatewayError) => void;
}

/** A local listener whose every connection is carried to the resource through the Proxy. */
async function localProxy(target: ResourceTarget, port: string, what: string, mode: E2EMode = 'off', hooks?: (ping: PingResponse, dialer: Dialer, context: ReturnType<typeof resourceTlsContext>) => LocalProxyHooks): Promise<void> {
  const profile = requireProfile();
  // One Dialer, one ping and one TLS context for every connection this listener carries.
  const dialer = new Dialer();
  const context = resourceTlsContext(profile);
  const ping = await fetchPing(profile, dialer);
  const address = routeAddress(profile, ping, target.alpn);
  const own = hooks?.(ping, dialer, context);
  const streams = streamsFor(profile, dialer, ping, target, mode, context, own?.classic);
  // Fail now, not at the first client connection, when the resource is unknown or not allowed. Only the Proxy
  // is asked: the resource itself sees no connection until a client makes one.
  if (own) await own.check(ping, dialer, context);
  else (await openResource(profile, address, { ...target, check: true }, dialer, context)).destroy();
  if (!/^\d{1,5}$/.test(port) || Number(port) > 65535) throw new GatewayError('GW_ERR_USAGE', `--port: "${port}" is not a port number`);
  const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (local) => {
    streams
      .open(target)
      .then((opened) => splice(local, opened.stream))
      .catch((err: unknown) => {
        const e = toGatewayError(err);
        process.stderr.write(`error: ${e.message}\ncode: ${e.code}\n`);
        // Reset, not ended: a client that reads to the end must not take "nothing" for a complete answer. Unless
        // the route answers in its client's protocol (kubectl gets an HTTP answer naming the code).
        if (own?.refuse) own.refuse(local, e);
        else resetStream(local);
      });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) =>
      reject(new GatewayError('GW_ERR_LISTEN', `cannot listen on 127.0.0.1:${port}: ${err.code ?? err.message}`, { hint: 'Choose another --port.' })),
    );
    server.listen(Number(port), '127.0.0.1', () => resolve());
  });
  const bound = (server.address() as net.AddressInfo).port;
  let more = '';
  try {
    more = own ? own.started(bound) : '';
  } catch (err) {
    server.close();
    streams.close();
    throw err;
  }
  process.stdout.write(`Started a local proxy for ${what} on 127.0.0.1:${bound} (end-to-end: ${mode})\n${more}`);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  server.close();
  streams.close();
}

const proxyCmd = program.command('proxy').description('local listeners that carry connections to resources through the Proxy');
proxyCmd
  .command('db')
  .description('listen on 127.0.0.1:PORT and carry each connection to the database (psql, mysql, redis-cli connect there)')
  .argument('<name>', 'database name (see gwsh db ls)')
  .option('--port <port>', 'local port (0 picks a free one)', '0')
  .option(...E2E_FLAG)
  .action(async (name: string, opts: { port: string; e2e?: string }) => {
    const mode = e2eModeOf(opts.e2e);
    const profile = requireProfile();
    const { items } = await apiFor(profile).call<{ items: InventoryItem[] }>('GET', '/v1/inventory/db');
    const db = items.find((i) => i.name === name);
    if (!db) {
      throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no database "${name}" that you may reach is connected`, { hint: "List them with 'gwsh db ls'." });
    }
    await localProxy({ alpn: databaseRoute(String(db.protocol)), resource: name }, opts.port, `${db.protocol} database "${name}"`, mode);
  });
proxyCmd
  .command('app')
  .description('listen on 127.0.0.1:PORT and carry each connection to the app (TCP, or HTTP spoken by a local client)')
  .argument('<name>', 'app name (see gwsh apps ls)')
  .option('--port <port>', 'local port (0 picks a free one)', '0')
  .option(...E2E_FLAG)
  .action(async (name: string, opts: { port: string; e2e?: string }) => {
    await localProxy({ alpn: 'gateway-tcp', resource: name, kind: 'app' }, opts.port, `app "${name}"`, e2eModeOf(opts.e2e));
  });
proxyCmd
  .command('kube')
  .description('listen on 127.0.0.1:PORT for kubectl (plain HTTP on loopback) and carry each connection to the Kubernetes cluster, end to end with its agent when it can')
  .argument('<cluster>', "the Kubernetes cluster's name (gwsh kube ls lists them)")
  .option('--port <port>', 'local port (0 picks a free one)', '0')
  .option('--kubeconfig <file>', "also merge a context for the listener into this kubeconfig and make it the current one (as gwsh kube login's)")
  .option(...E2E_FLAG)
  .action(async (cluster: string, opts: { port: string; kubeconfig?: string; e2e?: string }) => {
    const mode = e2eModeOf(opts.e2e);
    const profile = requireProfile();
    await localProxy({ alpn: KUBE_ROUTE, resource: cluster }, opts.port, `Kubernetes cluster "${cluster}"`, mode, (ping, dialer, context) => ({
      check: () => checkKubeCluster(apiFor(profile), cluster),
      // The classic route's address is known only when it is needed (a Proxy without it may still carry end to end).
      classic: () => kubeClassicOpener(profile, dialer, kubeRoute(profile, ping), context)(),
      started: (port) => kubeProxyStarted(profile, cluster, port, opts.kubeconfig),
      refuse: kubeRefusal,
    }));
  });
// Desktops keep the classic route in this version (end-to-end streams cover TCP apps, databases and SSH).
proxyCmd
  .command('desktop')
  .description('listen on 127.0.0.1:PORT and carry each connection to the desktop (point an RDP client there)')
  .argument('<name>', 'desktop name (see gwsh desktops ls)')
  .option('--port <port>', 'local port (0 picks a free one)', '0')
  .action(async (name: string, opts: { port: string }) => {
    await localProxy({ alpn: 'gateway-tcp', resource: name, kind: 'desktop' }, opts.port, `desktop "${name}"`);
  });

/** "[login@]node[:port]" → parts; the login defaults to the local user name. */
function parseSshTarget(text: string): { login: string; node: string } {
  const at = text.lastIndexOf('@');
  const login = at < 0 ? userInfo().username : text.slice(0, at);
  const node = (at < 0 ? text : text.slice(at + 1)).replace(/:\d+$/, '');
  if (!login || !node) throw new GatewayError('GW_ERR_USAGE', `"${text}" is not [login@]node[:port]`);
  return { login, node };
}

proxyCmd
  .command('ssh')
  .description("carry SSH to a node on standard input/output (OpenSSH's ProxyCommand)")
  .argument('<target>', '[login@]node[:port]')
  .option(...E2E_FLAG)
  .action(async (targetText: string, opts: { e2e?: string }) => {
    const mode = e2eModeOf(opts.e2e);
    // Under `gwsh ssh`, a failure is handed to it (PROXY_ERROR_ENV) to be printed after OpenSSH's own lines.
    const errorFile = process.env[PROXY_ERROR_ENV];
    if (!errorFile) return proxySsh(targetText, mode);
    try {
      await proxySsh(targetText, mode);
    } catch (err) {
      const e = toGatewayError(err);
      writeSecretFile(errorFile, JSON.stringify({ code: e.code, message: e.message, hint: e.hint }));
      process.exitCode = 1;
    }
  });

/**
 * Where `gwsh ssh` asks its ProxyCommand to leave the error that ended it: ssh prints its own lines after a
 * ProxyCommand fails ("kex_exchange_identification: Connection closed by remote host", "Connection closed by
 * UNKNOWN port 65535"), which would bury the real error; gwsh ssh prints it last instead, and exits 1.
 */
const PROXY_ERROR_ENV = 'GWSH_PROXY_ERROR_FILE';

/** The ProxyCommand's work: the SSH stream to the node on standard input/output. */
async function proxySsh(targetText: string, mode: E2EMode): Promise<void> {
  const profile = requireProfile();
  const { login, node } = parseSshTarget(targetText);
  const dialer = new Dialer();
  const ping = await fetchPing(profile, dialer);
  const target: ResourceTarget = { alpn: 'gateway-proxy-ssh', resource: node, login };
  const streams = streamsFor(profile, dialer, ping, target, mode);
  // One stream per process: the grant session is not kept past it.
  const stream = await streams.open(target).then((opened) => opened.stream).finally(() => streams.close());
  process.stdin.pipe(stream);
  stream.pipe(process.stdout);
  await new Promise<void>((resolve) => {
    // 'end' too: when the Proxy ends the connection (a lock, a removed user) nothing more can come, and ssh
    // only learns that the session is over when this process exits (pipe() never ends process.stdout).
    stream.once('end', resolve);
    stream.once('close', resolve);
    stream.once('error', resolve);
  });
  // Let ssh close its end first (it has the session's exit status by now): exiting while ssh may still write
  // to us could hand it a broken pipe. Give it a moment, then go regardless.
  if (!process.stdin.readableEnded) {
    process.stdin.unpipe(stream);
    process.stdin.resume();
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 2_000);
      timer.unref();
      process.stdin.once('end', resolve);
      process.stdin.once('close', resolve);
    });
  }
  process.stdin.destroy();
  // Standard output cannot be reset: a connection that broke instead of ending (the Proxy gone mid-session) is
  // said by the exit status (ssh sees the SSH stream cut as well).
  if (!endedCleanly(stream)) process.exitCode = 1;
  // The session is over: after the Proxy's 'end' our side of the connection is still open (half-open sockets),
  // and it would keep this process, and so ssh waiting for it, alive until the Proxy's half-close linger.
  stream.destroy();
}

program
  .command('known-hosts')
  .description("print a node's SSH host key after checking its certificate against the cluster's host CA (OpenSSH's KnownHostsCommand)")
  .argument('<host>', 'node name as ssh was given it')
  .action(async (host: string) => {
    const profile = requireProfile();
    const ca = readFileSync(join(profile.dir, 'ssh-host-ca.pub'), 'utf8').trim();
    // OpenSSH's %H is "[host]:port" for a port other than 22: match on the host, print what ssh asked for.
    const bare = /^\[(.*)\]:\d+$/.exec(host)?.[1] ?? host;
    if (bare === profile.proxy.replace(/:\d+$/, '').replace(/^\[|\]$/g, '')) {
      // The Proxy itself, as an SSH jump host (separate listeners): its keys, from /webapi/find over verified TLS.
      const find = await new ApiClient({ address: profile.proxy, ca: profile.hostCa }).call<{ tunnel_host_keys?: string[] }>('GET', '/webapi/find');
      for (const key of find.tunnel_host_keys ?? []) process.stdout.write(`${host} ${key}\n`);
      return;
    }
    const { items } = await apiFor(profile).call<{ items: Array<InventoryItem & { host_cert?: string; host_id: string }> }>('GET', '/v1/inventory/node');
    const node = items.find((i) => i.name === bare || i.host_id === bare);
    // Always offer the CA itself too, so OpenSSH can check a host certificate where a server presents one.
    process.stdout.write(`@cert-authority * ${ca}\n`);
    if (!node?.host_cert) return;
    const cert = parseSshCert(node.host_cert, ca);
    if (cert.signedByCa !== true || cert.certType !== 'host' || !cert.principals.includes(node.name) || Date.now() >= cert.validBefore) {
      throw new GatewayError('GW_ERR_TUNNEL_AUTH', `the host certificate of "${host}" is not valid for this cluster`);
    }
    process.stdout.write(`${host} ${cert.publicKey}\n`);
  });

function sshConfig(profile: ReturnType<typeof requireProfile>, jumpAddr?: string): string {
  // gwsh runs from ssh with this profile whatever the caller's environment holds.
  const gwsh = `/usr/bin/env GWSH_HOME="${profile.dir}" "${process.execPath}" "${fileURLToPath(import.meta.url)}"`;
  const dir = profile.dir;
  const proxyHost = profile.proxy.replace(/:\d+$/, '').replace(/^\[|\]$/g, '');
  const identity = [
    `    IdentityFile ${join(dir, 'ssh-key')}`,
    `    CertificateFile ${join(dir, 'ssh-key-cert.pub')}`,
    `    IdentitiesOnly yes`,
    `    KnownHostsCommand ${gwsh} known-hosts %H`,
    `    UserKnownHostsFile /dev/null`,
    `    GlobalKnownHostsFile /dev/null`,
    `    StrictHostKeyChecking yes`,
  ];
  const jumpPort = jumpAddr ? /:(\d+)$/.exec(jumpAddr)?.[1] : undefined;
  return [
    `# SSH through the gateway cluster ${profile.cluster} (proxy ${profile.proxy}), written by 'gwsh config'.`,
    `# Use it with: ssh -F <this file> login@node   (scp and sftp take -F too)`,
    ...(jumpAddr
      ? [
          `# The cluster uses separate listeners: the Proxy's SSH port is a jump host.`,
          `Host ${proxyHost}`,
          `    Port ${jumpPort}`,
          `    User gateway`,
          ...identity,
          `Host * !${proxyHost}`,
          `    ProxyJump gateway@${proxyHost}:${jumpPort}`,
        ]
      : [`Host * !${proxyHost}`, `    ProxyCommand ${gwsh} proxy ssh %r@%h:%p`]),
    ...identity,
    `    UpdateHostKeys no`,
    `    ServerAliveInterval 20`,
    `    SetEnv GATEWAY_CLUSTER=${profile.cluster}`,
    '',
  ].join('\n');
}

/** The configuration for this cluster: ProxyCommand with TLS routing, ProxyJump to the SSH port without it. */
async function sshConfigFor(profile: ReturnType<typeof requireProfile>): Promise<string> {
  const ping = await fetchPing(profile, new Dialer());
  return sshConfig(profile, ping.proxy.tls_routing_enabled ? undefined : ping.proxy.ssh.ssh_public_addr);
}

program
  .command('config')
  .description("print an OpenSSH client configuration block, so that ssh, scp and sftp reach nodes through the gateway")
  .action(async () => {
    process.stdout.write(await sshConfigFor(requireProfile()));
  });

program
  .command('ssh')
  .description('run a command on a node, or open an interactive shell (OpenSSH with the gateway configuration: every ssh flag works)')
  .argument('<target>', '[login@]node')
  .argument('[command...]', 'command to run')
  .option(...E2E_FLAG)
  .allowUnknownOption(true)
  .passThroughOptions(true)
  .action(async (target: string, command: string[], opts: { e2e?: string }, cmd: { args: string[] }) => {
    // Checked here, handed to the ProxyCommand ssh runs (gwsh proxy ssh) through the environment.
    const mode = e2eModeOf(opts.e2e);
    const profile = requireProfile();
    const configFile = join(profile.dir, 'ssh_config');
    writeSecretFile(configFile, await sshConfigFor(profile)); // atomic: another gwsh ssh may be reading it
    const args = ['-F', configFile, ...cmd.args];
    void target;
    void command;
    const errorFile = join(profile.dir, `.proxy-error-${randomBytes(6).toString('hex')}`);
    const child = spawnChild('ssh', args, { stdio: 'inherit', env: { ...process.env, [PROXY_ERROR_ENV]: errorFile, [E2E_ENV]: mode } });
    const code = await new Promise<number>((resolve) => child.once('exit', (c, sig) => resolve(c ?? (sig ? 255 : 0))));
    const failure = takeProxyError(errorFile);
    if (failure) throw failure; // the real error, after OpenSSH's lines; exit status 1
    process.exitCode = code;
  });

/** The error a ProxyCommand left in file (removed here), or undefined. Read bounded: it is a few lines of JSON. */
function takeProxyError(file: string): GatewayError | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8').slice(0, 16 * 1024);
    rmSync(file, { force: true });
  } catch {
    return undefined;
  }
  try {
    const e = JSON.parse(text) as { code?: unknown; message?: unknown; hint?: unknown };
    const code = typeof e.code === 'string' && isErrorCode(e.code) ? e.code : 'GW_ERR_INTERNAL';
    return new GatewayError(code, `the connection through the gateway failed: ${String(e.message)}`, typeof e.hint === 'string' ? { hint: e.hint } : {});
  } catch {
    return undefined;
  }
}

function printStatus(format: Format): void {
  const profile = loadProfile();
  if (!profile) {
    throw new GatewayError('GW_ERR_CLIENT_NOT_LOGGED_IN', 'not logged in', { hint: "Run 'gwsh login --proxy=HOST:PORT --user=USER'." });
  }
  const expired = Date.parse(profile.valid_until) <= Date.now();
  const active = {
    username: profile.username,
    roles: profile.identity.roles,
    logins: profile.identity.logins ?? [],
    cluster: profile.cluster,
    proxy: profile.proxy,
    valid_until: profile.valid_until,
    expired,
  };
  if (format !== 'text') {
    process.stdout.write(render(format, { active }, () => ''));
    return;
  }
  process.stdout.write(
    [
      `> Profile URL:  https://${profile.proxy}`,
      `  Logged in as: ${active.username}`,
      `  Cluster:      ${active.cluster}`,
      `  Roles:        ${active.roles.join(', ') || '(none)'}`,
      `  Logins:       ${active.logins.join(', ') || '(none)'}`,
      `  Valid until:  ${active.valid_until}${expired ? ' [EXPIRED]' : ''}`,
      '',
    ].join('\n'),
  );
}

addCompletionCommands(program, {
  description: ['gwsh login signs in through a Proxy and keeps short-lived certificates in a profile; the other commands use them. docs/cli.md lists the commands with examples.'],
  environment: [
    ...PROXY_ENVIRONMENT,
    ['GWSH_HOME', 'The profile directory instead of ~/.gwsh.'],
    [E2E_ENV, 'End-to-end streams with the agent when --e2e is not given: auto (the default), require or off.'],
  ],
  files: [['~/.gwsh', 'The profile: profile.json, the key and certificates of the last login (key.pem, cert.pem, ssh-key, ssh-key-cert.pub), the cluster CAs trusted per Proxy address (known_cas.json).']],
  seeAlso: ['gateway(1)', 'gwctl(1)', 'ssh(1)'],
});

// Traces (src/trace.ts): on only when the OTEL_ variables name an endpoint; what is queued is sent before exit.
program.hook('preAction', async () => {
  const settings = tracingSettings(undefined, process.env, 'gwsh');
  if (settings) await startTracing({ ...settings, exportDelayMs: 0 });
});
debugOnEveryCommand(program);
await runCli(program);

/**
 * --debug after the subcommand too (`gwsh proxy app X --debug`, as users type it): gwsh's positional options take the
 * program's own options only before a subcommand, so each command but `ssh` (whose flags are OpenSSH's) declares it
 * again. debugLine and runCli read it from the whole command line either way.
 */
function debugOnEveryCommand(parent: Command): void {
  for (const cmd of parent.commands) {
    if (cmd.name() === 'ssh' && parent === program) continue;
    if (!cmd.options.some((o) => o.long === '--debug')) cmd.option('--debug', 'print stack traces and the path each connection took');
    debugOnEveryCommand(cmd);
  }
}
await stopTracing();
