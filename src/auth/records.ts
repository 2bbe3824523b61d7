/**
 * What the Auth Service keeps in the Backend: the keys and the stored shapes that its modules share. Each record
 * has one module that writes it (authorities.ts, users.ts, joining.ts, lockadmin.ts, agents.ts, audit.ts,
 * manifests.ts for what only manifests write); the others may read it through these keys.
 */
import { randomBytes } from 'node:crypto';
import type { Backend, Item } from '../backend/index.js';
import type { AgentResources } from '../tunnel/protocol.js';
import type { UserResource } from './resources/index.js';

export const JOIN_ROLES = ['node', 'db', 'app', 'kube', 'desktop', 'proxy'] as const;
export type JoinRole = (typeof JOIN_ROLES)[number];

/** Names of users and nodes: 1-128 letters, digits, ".", "_", "@" or "-", starting with a letter or digit. */
export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$/;

export const KEYS = {
  clusterName: '/cluster/name',
  authority: (type: 'host' | 'user') => `/authorities/${type}`,
  user: (name: string) => `/users/${name}`,
  role: (name: string) => `/roles/${name}`,
  token: (id: string) => `/tokens/${id}`,
  connector: (kind: string, name: string) => `/connectors/${kind}/${name}`,
  maintenance: '/cluster_maintenance_config',
  node: (hostId: string) => `/nodes/${hostId}`,
  presence: (hostId: string) => `/presence/${hostId}`,
  event: (time: number) => `/events/${String(time).padStart(15, '0')}-${randomBytes(4).toString('hex')}`,
};

export interface StoredUser {
  resource: UserResource;
  passwordHash?: string;
  createdAt: string;
}

export interface StoredToken {
  id: string;
  roles: JoinRole[];
  expiresAt: number;
  /** 0 = unlimited until expiry. */
  uses: number;
  used: number;
  createdAt: string;
  createdBy: string;
  labels?: Record<string, string>;
}

export interface NodeRecord {
  hostId: string;
  nodename: string;
  roles: JoinRole[];
  publicAddrs: string[];
  joinedAt: string;
  source?: string;
  /** The SSH public key its host certificate certifies: what it must authenticate its reverse tunnel with. */
  sshPublicKey?: string;
}

/** An agent connected to a proxy right now (written by the proxy's tunnel registry, expires unless refreshed). */
export interface Presence {
  hostId: string;
  nodename: string;
  proxyId: string;
  services: string[];
  resources: AgentResources;
  connectedAt: string;
  lastHeartbeat: string;
}

export function parseJson<T>(item: Item | undefined): T | undefined {
  return item === undefined ? undefined : (JSON.parse(item.value) as T);
}

export async function readJson<T>(backend: Backend, key: string): Promise<T | undefined> {
  return parseJson<T>(await backend.get(key));
}

