/**
 * The first lines `gateway start` prints: what runs, where it listens, where its data is, the CA pin and the
 * next command. A newcomer reads these; operators get the same facts in the "gateway started" log line.
 */
import { userInfo } from 'node:os';
import { caPin } from '../auth/pki/tls.js';
import type { GatewayConfig } from '../config/index.js';
import { proxyAddressForClients, type Daemon } from '../daemon.js';
import { defaultDataDir, isRoot } from '../paths.js';
import { anySourceBelieved } from '../mux/trust.js';
import { VERSION } from '../version.js';
import { listenerRows } from '../wire/protocols.js';

/** Each listener's line: the Proxy's separate listeners are the wire table's (as the Proxy names them, proxy_<name>). */
const LISTENERS: Record<string, string> = {
  ...Object.fromEntries(listenerRows().map(({ listener: l }) => [l.name === 'web' ? 'web' : `proxy_${l.name}`, l.label])),
  auth: 'Auth API (mutual TLS)',
  proxy_peer: 'proxy peering',
  ssh: 'SSH Service (direct)',
};

function label(name: string, config: GatewayConfig): string {
  if (name === 'web' && config.auth_service.proxy_listener_mode === 'multiplex') return 'web, API and (TLS routing) every protocol';
  return LISTENERS[name] ?? name;
}

export function startBanner(config: GatewayConfig, daemon: Daemon): string {
  const lines = [`Gateway ${VERSION} started: ${daemon.services.join(', ')}`];
  for (const [name, addr] of Object.entries(daemon.addresses)) lines.push(`  ${label(name, config).padEnd(44)} ${addr}`);
  const dataDir = config.gateway.data_dir;
  lines.push(`  ${'data directory'.padEnd(44)} ${dataDir}`);
  const ca = daemon.auth?.host.tls.certPem ?? daemon.hostIdentity?.hostCa;
  if (ca) lines.push(`  ${'CA pin'.padEnd(44)} ${caPin(ca)}`);
  const p = config.proxy_service;
  const onePort = config.auth_service.proxy_listener_mode === 'multiplex';
  if (daemon.addresses.web && anySourceBelieved({ onePort, proxyProtocol: p.proxy_protocol === 'on', sources: p.proxy_protocol_trusted_sources })) {
    lines.push('');
    lines.push('WARNING: proxy_protocol is on and proxy_service.proxy_protocol_trusted_sources is empty: a PROXY header is');
    lines.push('  believed from ANY source, so a client that reaches this port directly picks the address it is rate-limited');
    lines.push('  and audited under. List your load balancers\' addresses or networks there (docs/security.md).');
  }
  if (daemon.hostIdentity) lines.push(`  ${'host id'.padEnd(44)} ${daemon.hostIdentity.hostId} (cluster ${daemon.hostIdentity.cluster})`);
  if (daemon.auth && daemon.addresses.web) {
    const who = isRoot() ? 'root' : userInfo().username;
    lines.push('');
    const reach = proxyAddressForClients(config, Number(daemon.addresses.web.slice(daemon.addresses.web.lastIndexOf(':') + 1)));
    lines.push(`Clients and agents reach this Proxy at ${reach} (set proxy_service.public_addr to the name they dial).`);
    lines.push(`Web UI: https://${reach}/web/ (sign in as a user made with gwctl users add; single sign-on: docs/sso.md)`);
    lines.push(`Admin commands on this machine, as ${who}: gwctl status, gwctl tokens add --type=db, gwctl users add NAME --roles=access`);
    if (dataDir !== defaultDataDir()) lines.push(`  (this is not the default data directory: give gwctl --data-dir=${dataDir})`);
  } else if (daemon.remoteAuth && daemon.addresses.web) {
    lines.push('');
    lines.push(`This Proxy uses the Auth Service at ${daemon.remoteAuth.addresses.join(', ')} (no Auth Service in this process).`);
    const reach = proxyAddressForClients(config, Number(daemon.addresses.web.slice(daemon.addresses.web.lastIndexOf(':') + 1)));
    lines.push(`Clients and agents reach this Proxy at ${reach} (set proxy_service.public_addr to the name they dial).`);
    lines.push(`Web UI: https://${reach}/web/`);
    lines.push(`Admin commands: on an Auth Service's machine (gwctl status, gwctl tokens add ...), or signed in through this Proxy.`);
  }
  return `${lines.join('\n')}\n`;
}
