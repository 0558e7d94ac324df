// Which action each /api route is (issue 42 §3): the authentication step checks the principal's role for it before
// the route reads a body, for every route at once. Site scopes need the route's own data (a device's site, a
// rollout's sites) and are checked in the routes (principal.seesSite, principal.siteCondition).
import type { Action } from './principal.js';

/** `METHOD pattern` (the express pattern addRoutes tags the request with, HEAD as GET) → its action. */
export const ROUTE_ACTIONS: Readonly<Record<string, Action>> = {
  'GET /api/config': 'config.read',
  'POST /api/reload-registry': 'registry.reload',
  'POST /api/register-device': 'registry.reload',
  'POST /api/notify-settings': 'settings.notify',
  'POST /api/update-settings': 'settings.notify',
  'GET /api/devices': 'fleet.read',
  'GET /api/devices/:device_id': 'fleet.read',
  'GET /api/overrides': 'fleet.read',
  'DELETE /api/devices/:device_id/override': 'settings.notify',
  'POST /api/rollouts': 'rollout.change',
  'GET /api/rollouts': 'fleet.read',
  'GET /api/rollouts/:rollout_id': 'fleet.read',
  'POST /api/rollouts/:rollout_id/pause': 'rollout.change',
  'POST /api/rollouts/:rollout_id/resume': 'rollout.change',
  'POST /api/rollouts/:rollout_id/cancel': 'rollout.change',
  'POST /api/rollouts/:rollout_id/rollback': 'rollout.change',
  'POST /api/rollouts/:rollout_id/promote': 'rollout.change',
  'GET /api/audit': 'audit.read',
};

/** The action of a request on `route` (undefined route: unlisted); a route not named is `route.unlisted`. */
export function actionOf(method: string, route: string | undefined): Action {
  const m = method === 'HEAD' ? 'GET' : method;
  return (route === undefined ? undefined : ROUTE_ACTIONS[`${m} ${route}`]) ?? 'route.unlisted';
}
