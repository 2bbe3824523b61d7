#!/usr/bin/env node
// Client CLI: sign in to a cluster through its Proxy and show the profile.
import { generateKeyPair } from '../auth/pki.js';
import type { CertBundle } from '../auth/service.js';
import { ApiClient, fetchPinnedCas, normalizeAddress } from '../client/api.js';
import { loadProfile, profileDir, removeProfile, saveProfile } from '../client/profile.js';
import { parseDuration } from '../duration.js';
import { GatewayError } from '../errors.js';
import { readPassword } from './prompt.js';
import { newProgram, runCli } from './run.js';

const program = newProgram('gwsh', 'Client CLI: log in and reach servers, databases, apps and clusters through the gateway.');

program
  .command('login')
  .description('sign in and receive short-lived certificates (password from the terminal, or standard input)')
  .requiredOption('--proxy <host:port>', "the Proxy's public web address")
  .requiredOption('--user <user>', 'user name')
  .option('--ca-pin <pin>', "the cluster's CA pin (sha256:...), to trust a cluster whose certificate is not publicly trusted")
  .option('--ttl <duration>', 'certificate lifetime (at most what the cluster allows, 12h by default)')
  .action(async (opts: { proxy: string; user: string; caPin?: string; ttl?: string }) => {
    const proxy = normalizeAddress(opts.proxy);
    const ttlMs = opts.ttl ? parseDuration(opts.ttl, '--ttl') : undefined;
    // Trust: a pinned cluster CA, else the CA the previous login to this proxy pinned, else the system's CAs.
    const previous = loadProfile();
    const ca = opts.caPin ? (await fetchPinnedCas(proxy, opts.caPin)).host_ca : previous?.proxy === proxy ? previous.hostCa : undefined;
    const password = await readPassword(`Enter password for ${opts.user}: `);
    const keys = generateKeyPair();
    const bundle = await new ApiClient({ address: proxy, ...(ca ? { ca } : {}) }).call<CertBundle>('POST', '/webapi/login', {
      username: opts.user,
      password,
      public_key: keys.publicKeyPem,
      ssh_public_key: keys.sshPublicKey,
      ...(ttlMs === undefined ? {} : { ttl_ms: ttlMs }),
    });
    saveProfile(profileDir(), proxy, opts.user, keys.privateKeyPem, bundle);
    printStatus('text');
  });

program
  .command('status')
  .description("print the current profile: user, roles (as the certificate carries them), cluster, validity")
  .option('-f, --format <format>', 'text or json', 'text')
  .action((opts: { format: string }) => {
    if (opts.format !== 'text' && opts.format !== 'json') throw new GatewayError('GW_ERR_USAGE', `--format: "${opts.format}" is not text or json`);
    printStatus(opts.format);
  });

program
  .command('logout')
  .description('remove the profile and its certificates')
  .action(() => {
    const had = removeProfile();
    process.stdout.write(had ? 'logged out\n' : 'not logged in\n');
  });

function printStatus(format: string): void {
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
  if (format === 'json') {
    process.stdout.write(`${JSON.stringify({ active }, null, 2)}\n`);
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

await runCli(program);
