/**
 * Running an agent that joined the Auth Service directly: its listeners (src/agent/direct.ts) and its own
 * presence. With no tunnel, no Proxy writes where it is; it writes /presence/<hostId>/direct itself through the
 * Auth API (PUT /v1/agent/presence, src/auth/agentapi.ts) every heartbeat interval with the tunnel's TTL rule
 * (interval × (keep_alive_count_max + 1)), removes it on a graceful stop, and sends the SSH Service's session
 * events to the Auth API (the tunnel would have carried them to a Proxy). docs/tunnels.md (Direct-join agents).
 */
import type { DirectAddrs } from '../auth/records.js';
import type { CertBundle } from '../wire/certs.js';
import type { GatewayConfig, ServiceName } from '../config/index.js';
import type { Dialer } from '../dial/dialer.js';
import { toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import type { ConnectionLimits } from '../net/deadlines.js';
import { advertisedAddr, startDirectListener, type DirectListener } from './direct.js';
import { identityClient, type HostIdentity } from './identity.js';
import type { RenewedCerts } from './renewal.js';
import { agentResources, agentServices, resourceConnector } from './resources.js';
import type { SshService } from './ssh.js';

export interface DirectJoinOptions {
  config: GatewayConfig;
  services: readonly ServiceName[];
  identity: HostIdentity;
  dialer: Dialer;
  limits: ConnectionLimits;
  /** The SSH Service, when ssh_service runs. */
  ssh?: SshService;
}

export interface DirectJoinAgent {
  /** The bound addresses of the listeners. */
  bound: DirectAddrs;
  /** What the presence record advertises (public_addr, else bound; the Auth Service fills in a wildcard host). */
  advertised: DirectAddrs;
  /** Writes the presence record now (also done every heartbeat interval). */
  heartbeat(): Promise<void>;
  /** An SSH session event for the audit log. */
  sendEvent(event: Record<string, unknown>): void;
  /** Fresh host certificates for this agent's key (POST /v1/agent/renew; src/agent/renewal.ts). */
  requestRenewal(publicKeyPem: string): Promise<RenewedCerts>;
  /** The identity was renewed: the listeners and the presence use its new certificates (the Auth API calls do by themselves). */
  renewed(): void;
  /** Stops the heartbeat, removes the presence record, closes the listeners. */
  stop(): Promise<void>;
}

export async function startDirectJoin(options: DirectJoinOptions): Promise<DirectJoinAgent> {
  const { config, services, identity, limits, ssh } = options;
  const log = logger('direct');
  const listeners: DirectListener[] = [];
  const bound: DirectAddrs = {};
  const advertised: DirectAddrs = {};
  try {
    const connect = resourceConnector(config, services, options.dialer, identity.cluster);
    if (ssh) {
      const l = await startDirectListener({ kind: 'ssh', addr: config.ssh_service.listen_addr, configKey: 'ssh_service.listen_addr', identity, connect, ssh, limits, log });
      listeners.push(l);
      bound.ssh = l.address;
      advertised.ssh = advertisedAddr(l.address, config.ssh_service.public_addr);
    }
    const kinds = [
      ['kube', 'kube_service', config.kube_service] as const,
      ['desktop', 'windows_desktop_service', config.windows_desktop_service] as const,
    ];
    for (const [kind, service, section] of kinds) {
      if (!services.includes(service)) continue;
      const l = await startDirectListener({ kind, addr: section.listen_addr, configKey: `${service}.listen_addr`, identity, connect, limits, log });
      listeners.push(l);
      bound[kind] = l.address;
      advertised[kind] = advertisedAddr(l.address, section.public_addr);
    }
  } catch (err) {
    await Promise.all(listeners.map((l) => l.close()));
    throw err;
  }
  if (services.some((s) => s === 'db_service' || s === 'app_service')) {
    log.warn('this agent joined the Auth Service directly: its databases and apps are reachable only through an agent that joined through a Proxy (they never open a listener)');
  }
  const api = identityClient(identity, { dialer: options.dialer, timeoutMs: 15_000, server: 'auth' });
  const intervalMs = config.auth_service.keep_alive_interval;
  const connectedAt = new Date().toISOString();
  const resources = agentResources(config, services);
  if (ssh) resources.node_host_cert = identity.sshCert;
  const body = { services: agentServices(services), resources, direct: advertised, connected_at: connectedAt, ttl_ms: intervalMs * (config.auth_service.keep_alive_count_max + 1) };
  const heartbeat = async () => {
    try {
      await api().call('PUT', '/v1/agent/presence', body);
    } catch (err) {
      const e = toGatewayError(err);
      log.warn({ code: e.code, err: e.message, auth: identity.server }, 'cannot write this agent\'s presence to the Auth Service; retrying next heartbeat');
    }
  };
  await heartbeat();
  const timer = setInterval(() => void heartbeat(), intervalMs);
  timer.unref();
  return {
    bound,
    advertised,
    heartbeat,
    sendEvent: (event) => void api().call('POST', '/v1/agent/events', { event }).catch((err: unknown) => log.warn({ err: toGatewayError(err).message }, 'cannot record an SSH session event')),
    requestRenewal: (publicKeyPem) => api().call<CertBundle>('POST', '/v1/agent/renew', { public_key: publicKeyPem }),
    renewed: () => {
      if (ssh) resources.node_host_cert = identity.sshCert;
      for (const l of listeners) l.refresh();
    },
    stop: async () => {
      clearInterval(timer);
      await api().call('DELETE', '/v1/agent/presence', { connected_at: connectedAt }).catch((err: unknown) => log.warn({ err: toGatewayError(err).message }, 'cannot remove this agent\'s presence'));
      await Promise.all(listeners.map((l) => l.close()));
    },
  };
}
