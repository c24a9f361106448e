"""etcd 3.4's Auth service on a node's client port: each RPC translated onto the native API's
AuthHandler (kv/server/auth_service.py), which holds the users, roles and permissions
(statemachine/auth_state.py) and makes the tokens (kv/server/credentials.py). Nothing of auth
is decided here: only etcd's messages in and out.

Any member answers. A change, and a read of the auth state (etcd runs both through its log), runs
on the leader: a follower forwards it (EtcdFace.forward). Authenticate runs on the member asked,
which reads its own applied state and makes the token; only a refusal it cannot confirm (a user
or password it may not know yet, auth not enabled yet) is sent on to the leader. The token is raftkv's signed one, an
opaque string to etcd's clients as etcd's simple tokens are (docs/etcd-compatibility.md).

etcd's Permission (permType, key, range_end) is raftkv's stored Permission field for field, both
ways: range_end empty is the one key, "\\0" every key from `key` on."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

from kv import errors
from kv.server.auth_service import AuthHandler
from kv.server.etcd_checks import EtcdError
from kv.server.etcd_face import EtcdFace
from raftkv_proto import etcd_auth_pb2 as authpb
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2

A = kv_pb2
R = TypeVar("R")
Answer = Callable[[kv_pb2.AuthAdminResponse], R]

# etcd 3.4 keeps users without a password (UserAddOptions.no_password, for client-certificate
# logins); raftkv does not (docs/etcd-compatibility.md).
NO_PASSWORD_REFUSED = EtcdError(grpc.StatusCode.INVALID_ARGUMENT,
                                "raftkv keeps no users without a password (no_password): give the user a password")


class EtcdAuthServicer(etcd_rpc_pb2_grpc.AuthServicer):
    def __init__(self, face: EtcdFace, auth: AuthHandler) -> None:
        self._face = face
        self._auth = auth

    # ---- login ---------------------------------------------------------------------------------

    async def Authenticate(self, request: pb.AuthenticateRequest,
                           context: grpc.aio.ServicerContext) -> pb.AuthenticateResponse:
        face = self._face

        async def work() -> pb.AuthenticateResponse:
            try:
                answer = await self._auth.authenticate(
                    kv_pb2.AuthenticateRequest(name=request.name, password=request.password),
                    context.time_remaining())
            except (errors.NotLeaderError, errors.FailedPreconditionError):
                # A refusal a follower cannot confirm (a password it may not have applied yet, or
                # auth enabled a moment ago): the leader answers, as etcd's reads its newest state.
                if face.leads():
                    raise
                return await face.forward(context, "Auth", "Authenticate", request, anyone=True)
            response = pb.AuthenticateResponse(token=answer.token)
            face.header(response.header)
            return response
        return await face.serve(context, work)

    # ---- auth on and off -----------------------------------------------------------------------

    async def AuthEnable(self, request: pb.AuthEnableRequest,
                         context: grpc.aio.ServicerContext) -> pb.AuthEnableResponse:
        return await self._admin(context, "AuthEnable", request, kv_pb2.AuthAdminRequest(action=A.AUTH_ENABLE),
                                 lambda _: pb.AuthEnableResponse())

    async def AuthDisable(self, request: pb.AuthDisableRequest,
                          context: grpc.aio.ServicerContext) -> pb.AuthDisableResponse:
        return await self._admin(context, "AuthDisable", request, kv_pb2.AuthAdminRequest(action=A.AUTH_DISABLE),
                                 lambda _: pb.AuthDisableResponse())

    # ---- users ---------------------------------------------------------------------------------

    async def UserAdd(self, request: pb.AuthUserAddRequest,
                      context: grpc.aio.ServicerContext) -> pb.AuthUserAddResponse:
        if request.options.no_password:
            return await self._face.serve(context, _refuse(NO_PASSWORD_REFUSED))
        return await self._admin(context, "UserAdd", request, kv_pb2.AuthAdminRequest(
            action=A.USER_ADD, user=request.name, password=request.password), lambda _: pb.AuthUserAddResponse())

    async def UserGet(self, request: pb.AuthUserGetRequest,
                      context: grpc.aio.ServicerContext) -> pb.AuthUserGetResponse:
        return await self._admin(context, "UserGet", request, kv_pb2.AuthAdminRequest(action=A.USER_GET,
                                                                                      user=request.name),
                                 lambda answer: pb.AuthUserGetResponse(roles=answer.users[0].roles))

    async def UserList(self, request: pb.AuthUserListRequest,
                       context: grpc.aio.ServicerContext) -> pb.AuthUserListResponse:
        return await self._admin(context, "UserList", request, kv_pb2.AuthAdminRequest(action=A.USER_LIST),
                                 lambda answer: pb.AuthUserListResponse(users=[u.name for u in answer.users]))

    async def UserDelete(self, request: pb.AuthUserDeleteRequest,
                         context: grpc.aio.ServicerContext) -> pb.AuthUserDeleteResponse:
        return await self._admin(context, "UserDelete", request, kv_pb2.AuthAdminRequest(action=A.USER_DELETE,
                                                                                         user=request.name),
                                 lambda _: pb.AuthUserDeleteResponse())

    async def UserChangePassword(self, request: pb.AuthUserChangePasswordRequest,
                                 context: grpc.aio.ServicerContext) -> pb.AuthUserChangePasswordResponse:
        return await self._admin(context, "UserChangePassword", request, kv_pb2.AuthAdminRequest(
            action=A.USER_CHANGE_PASSWORD, user=request.name, password=request.password),
            lambda _: pb.AuthUserChangePasswordResponse())

    async def UserGrantRole(self, request: pb.AuthUserGrantRoleRequest,
                            context: grpc.aio.ServicerContext) -> pb.AuthUserGrantRoleResponse:
        return await self._admin(context, "UserGrantRole", request, kv_pb2.AuthAdminRequest(
            action=A.USER_GRANT_ROLE, user=request.user, role=request.role), lambda _: pb.AuthUserGrantRoleResponse())

    async def UserRevokeRole(self, request: pb.AuthUserRevokeRoleRequest,
                             context: grpc.aio.ServicerContext) -> pb.AuthUserRevokeRoleResponse:
        return await self._admin(context, "UserRevokeRole", request, kv_pb2.AuthAdminRequest(
            action=A.USER_REVOKE_ROLE, user=request.name, role=request.role), lambda _: pb.AuthUserRevokeRoleResponse())

    # ---- roles ---------------------------------------------------------------------------------

    async def RoleAdd(self, request: pb.AuthRoleAddRequest,
                      context: grpc.aio.ServicerContext) -> pb.AuthRoleAddResponse:
        return await self._admin(context, "RoleAdd", request, kv_pb2.AuthAdminRequest(action=A.ROLE_ADD,
                                                                                      role=request.name),
                                 lambda _: pb.AuthRoleAddResponse())

    async def RoleGet(self, request: pb.AuthRoleGetRequest,
                      context: grpc.aio.ServicerContext) -> pb.AuthRoleGetResponse:
        return await self._admin(context, "RoleGet", request, kv_pb2.AuthAdminRequest(action=A.ROLE_GET,
                                                                                      role=request.role),
                                 lambda answer: pb.AuthRoleGetResponse(
                                     perm=[etcd_permission(p) for p in answer.roles[0].permissions]))

    async def RoleList(self, request: pb.AuthRoleListRequest,
                       context: grpc.aio.ServicerContext) -> pb.AuthRoleListResponse:
        return await self._admin(context, "RoleList", request, kv_pb2.AuthAdminRequest(action=A.ROLE_LIST),
                                 lambda answer: pb.AuthRoleListResponse(roles=[r.name for r in answer.roles]))

    async def RoleDelete(self, request: pb.AuthRoleDeleteRequest,
                         context: grpc.aio.ServicerContext) -> pb.AuthRoleDeleteResponse:
        return await self._admin(context, "RoleDelete", request, kv_pb2.AuthAdminRequest(action=A.ROLE_DELETE,
                                                                                         role=request.role),
                                 lambda _: pb.AuthRoleDeleteResponse())

    async def RoleGrantPermission(self, request: pb.AuthRoleGrantPermissionRequest,
                                  context: grpc.aio.ServicerContext) -> pb.AuthRoleGrantPermissionResponse:
        return await self._admin(context, "RoleGrantPermission", request, kv_pb2.AuthAdminRequest(
            action=A.ROLE_GRANT_PERMISSION, role=request.name, permission=stored_permission(request.perm)),
            lambda _: pb.AuthRoleGrantPermissionResponse())

    async def RoleRevokePermission(self, request: pb.AuthRoleRevokePermissionRequest,
                                   context: grpc.aio.ServicerContext) -> pb.AuthRoleRevokePermissionResponse:
        return await self._admin(context, "RoleRevokePermission", request, kv_pb2.AuthAdminRequest(
            action=A.ROLE_REVOKE_PERMISSION, role=request.role,
            permission=kv_pb2.Permission(key=request.key, range_end=request.range_end)),
            lambda _: pb.AuthRoleRevokePermissionResponse())

    # ---- the one way every admin RPC goes ------------------------------------------------------

    async def _admin(self, context: grpc.aio.ServicerContext, method: str, request: object,
                     native: kv_pb2.AuthAdminRequest, answer: Answer[R]) -> R:
        """`native` run by AuthHandler on the leader as the caller (a follower forwards `request`
        to the leader's `method`), its answer as etcd's response through `answer`."""
        face = self._face

        async def work() -> R:
            if not face.leads():
                return await face.forward(context, "Auth", method, request)
            done = await self._auth.admin(native, face.gate.caller(context), context.time_remaining(),
                                          own_reads=True)
            response = answer(done)
            face.header(response.header)  # type: ignore[attr-defined]
            return response
        return await face.serve(context, work)


def stored_permission(perm: authpb.Permission) -> kv_pb2.Permission:
    """etcd's Permission as raftkv stores it (the same three fields, the same type numbers)."""
    return kv_pb2.Permission(perm_type=perm.permType, key=perm.key, range_end=perm.range_end)


def etcd_permission(perm: kv_pb2.Permission) -> authpb.Permission:
    return authpb.Permission(permType=perm.perm_type, key=perm.key, range_end=perm.range_end)


def _refuse(error: EtcdError) -> Callable[[], object]:
    async def refused() -> object:
        raise error
    return refused
