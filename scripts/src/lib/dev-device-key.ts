// The local stack's device key: `npm start` issues one for the demo device on its first start and keeps it in
// the git-ignored data folder, so its banner can print a ready-to-run coaps command every time. A production
// key is printed once by `npm run device-key -- issue` and kept by whoever provisions the device.
import { readFileSync } from 'node:fs';
import { userInfo } from 'node:os';
import {
  commandPrincipal,
  issueAudited,
  listCredentials,
  type GatewayDatabase,
} from '@platform/device-gateway';
import { createDb } from '@platform/service-kit';
import { writePrivateFile } from './private-file.js';

export interface DevDeviceKey {
  deviceId: string;
  identity: string;
  /** The key as text: libcoap's `-k` takes it as is; its UTF-8 bytes are the PSK. */
  keyText: string;
}

export async function ensureDevDeviceKey(
  ownerUrl: string,
  file: string,
  deviceId: string,
): Promise<DevDeviceKey> {
  const db = createDb<GatewayDatabase>(ownerUrl, { max: 1, applicationName: 'npm-start' });
  try {
    const kept = readKept(file);
    if (kept !== undefined && kept.deviceId === deviceId) {
      const listed = await listCredentials(db, deviceId);
      if (listed.some((c) => c.identity === kept.identity && c.status === 'valid')) return kept;
    }
    // Audited like the device-key command's keys: by `command:npm-start`, with the OS user that ran it.
    const issued = await issueAudited(
      db,
      deviceId,
      { identity: `dev-${deviceId}-${Date.now().toString(36)}` },
      { principal: commandPrincipal('npm-start'), ...osUser() },
    );
    const key: DevDeviceKey = { deviceId, identity: issued.identity, keyText: issued.keyText };
    writePrivateFile(file, `${JSON.stringify(key, null, 2)}\n`);
    return key;
  } finally {
    await db.destroy();
  }
}

function osUser(): { osUser?: string } {
  try {
    return { osUser: userInfo().username };
  } catch {
    return {}; // no passwd entry (a container's arbitrary uid)
  }
}

function readKept(file: string): DevDeviceKey | undefined {
  try {
    const parsed = JSON.parse(readFileSync(file, 'utf8')) as Partial<DevDeviceKey>;
    if (
      typeof parsed.deviceId === 'string' &&
      typeof parsed.identity === 'string' &&
      typeof parsed.keyText === 'string'
    )
      return { deviceId: parsed.deviceId, identity: parsed.identity, keyText: parsed.keyText };
  } catch {
    // No file yet, or not ours: a new key is issued.
  }
  return undefined;
}
