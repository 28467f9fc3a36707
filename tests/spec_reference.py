# The specification's reference program (section 4 of the specification summarised in docs/spec.md), copied
# verbatim; tests/compare_walkthrough.py runs it beside examples/seed_walkthrough.
import math
import copy

def transpose(A): return [list(row) for row in zip(*A)]
def mm(A,B):
    return [[sum(a*b for a,b in zip(row,col)) for col in zip(*B)] for row in A]
def scaled(A,c): return [[c*x for x in row] for row in A]
def softmax(z):
    m=max(z); e=[math.exp(v-m) for v in z]
    return [v/sum(e) for v in e]
def forward(Q,K,V):
    S=scaled(mm(Q,transpose(K)),1/math.sqrt(len(Q[0])))
    A=[softmax(row) for row in S]
    return mm(A,V),A
Q_test=[[1.,2.],[0.,1.]]; K_test=[[1.,0.],[2.,1.]]
assert mm(Q_test,transpose(K_test))==[[1.,4.],[0.,1.]]
assert mm(Q_test,K_test)!=mm(Q_test,transpose(K_test))
G=[[1.,0.],[0.,2.]]
def objective(Q,K,V):
    O,_=forward(Q,K,V)
    return sum(x*g for row,gr in zip(O,G) for x,g in zip(row,gr))
def backward(Q,K,V):
    O,A=forward(Q,K,V)
    dV=mm(transpose(A),G); dA=mm(G,transpose(V)); dS=[]
    for i,row in enumerate(A):
        mean=sum(a*g for a,g in zip(row,dA[i]))
        dS.append([A[i][j]*(dA[i][j]-mean) for j in range(len(row))])
    assert all(abs(sum(row))<1e-12 for row in dS)
    dQ=scaled(mm(dS,K),1/math.sqrt(len(Q[0])))
    dK=scaled(mm(transpose(dS),Q),1/math.sqrt(len(Q[0])))
    return dQ,dK,dV

a=math.sqrt(2)*math.log(3)
Q=[[a,0.],[0.,a]]; K=[[1.,0.],[0.,1.]]; V=[[2.,0.],[0.,4.]]
O,A=forward(Q,K,V)
assert max(abs(A[i][j]-[[.75,.25],[.25,.75]][i][j]) for i in range(2) for j in range(2))<1e-12
assert abs(objective(Q,K,V)-7.5)<1e-12
analytic=backward(Q,K,V); fd_errors=[]
for h in (1e-5,1e-6):
    for field in range(3):
        error=0.
        for i in range(2):
            for j in range(2):
                plus=copy.deepcopy([Q,K,V]); minus=copy.deepcopy([Q,K,V])
                plus[field][i][j]+=h; minus[field][i][j]-=h
                numeric=(objective(*plus)-objective(*minus))/(2*h)
                error=max(error,abs(numeric-analytic[field][i][j]))
        fd_errors.append(error)
assert max(fd_errors)<1e-7

X=[[1.,0.],[0.,1.]]; Wq=copy.deepcopy(Q); Wk=copy.deepcopy(K); Wv=copy.deepcopy(V)
def projected_loss(x): return objective(mm(x,Wq),mm(x,Wk),mm(x,Wv))
dQ,dK,dV=analytic
branches=[mm(dQ,transpose(Wq)),mm(dK,transpose(Wk)),mm(dV,transpose(Wv))]
dX=[[sum(branch[i][j] for branch in branches) for j in range(2)] for i in range(2)]
x_error=0.; h=1e-6
for i in range(2):
    for j in range(2):
        plus=copy.deepcopy(X); minus=copy.deepcopy(X)
        plus[i][j]+=h; minus[i][j]-=h
        numeric=(projected_loss(plus)-projected_loss(minus))/(2*h)
        x_error=max(x_error,abs(numeric-dX[i][j]))
assert x_error<1e-7
same_keys=[[1.,1.],[1.,1.]]
O_same,A_same=forward(Q,same_keys,V)
dQ_same,_,_=backward(Q,same_keys,V)
assert all(abs(x)<1e-12 for row in dQ_same for x in row)
assert O_same==[[1.,2.],[1.,2.]]
print("attention_weights",A)
print("output",O,"probe_loss",objective(Q,K,V))
print("dQ",dQ,"dK",dK,"dV",dV)
print("QKV_finite_difference_max_error",max(fd_errors))
print("shared_X_finite_difference_max_error",x_error)
print("same_key_output",O_same,"same_key_dQ",dQ_same)
print("all_attention_checks_passed")
